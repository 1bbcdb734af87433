#!/usr/bin/env bash
# Creates the benchmarking venv at <repo>/.venv-bench, separate from the
# package's own venv: keras-hub and transformers stay out of the package's
# dependencies (they are the `bench` extra of pyproject.toml).
#
# torch is pinned and installed FIRST: torch==2.13.0 is the CPU build (on this
# machine pip takes it from a local wheel); an unpinned `torch` pulled in by
# another requirement would fetch a multi-GB CUDA build instead.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv-bench}"
PYTHON="${PYTHON:-python3}"

"$PYTHON" -m venv "$VENV"
# shellcheck disable=SC1091
. "$VENV/bin/activate"
python -m pip install --upgrade pip
pip install "torch==2.13.0"
# keras-hub may pull tensorflow-text, which pins a `tensorflow` version; if
# that conflicts with tensorflow-cpu, pip resolves it (possibly installing
# `tensorflow` instead, which runs on the CPU just the same).
pip install "torch==2.13.0" "jax[cpu]" tensorflow-cpu keras keras-hub transformers \
    tokenizers safetensors huggingface_hub matplotlib
# The package itself, without re-resolving its dependencies (they are above).
pip install --no-deps -e .
pip list 2>/dev/null | grep -iE '^(torch|jax|jaxlib|tensorflow.*|keras.*|transformers|numpy|matplotlib) '
