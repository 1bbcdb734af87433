#!/usr/bin/env bash
# Creates (or updates) ./.venv-litert: torch, the package with its `litert`
# extra (litert-torch) and pytest, for tests/models/test_litert_torch_export.py.
# An environment of its own: litert-torch 0.10 (through xdsl) pins
# typing-extensions below 4.13, which the notebook tests' Jupyter packages
# refuse, so it cannot join ./.venv.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
if [ ! -x .venv-litert/bin/python ]; then
  "$PYTHON" -m venv .venv-litert
fi
. .venv-litert/bin/activate
export PIP_DISABLE_PIP_VERSION_CHECK=1
# torch first and pinned with pip, the rest with uv, as in setup_env.sh
# (litert-torch 0.10 takes torch < 2.15).
python -m pip install -q --no-compile "torch==2.13.0" uv
uv pip install --python .venv-litert/bin/python -q -e ".[torch,litert]" "pytest>=8"
