#!/usr/bin/env bash
# Runs benchmarks/gpu_attention_benchmark.py once per Keras backend (jax,
# torch), each in its own process, on a machine with a GPU, and tees
# everything to one log. (TensorFlow is not covered.)
#
#   bash benchmarks/run_gpu_attention_benchmark.sh [extra flags for gpu_attention_benchmark.py]
#
# Env: PYTHON (default .venv-bench/bin/python where it exists, else python3),
# RESULTS (folder for the log and JSON; default benchmarks/results),
# BACKENDS (default "torch jax"), TIMEOUT (seconds per backend; default none).
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -z "${PYTHON:-}" ]; then
    if [ -x .venv-bench/bin/python ]; then PYTHON=.venv-bench/bin/python; else PYTHON=python3; fi
fi
BACKENDS="${BACKENDS:-torch jax}"
RESULTS="${RESULTS:-benchmarks/results}"
mkdir -p "$RESULTS"
STAMP="$(date +%Y%m%d-%H%M%S)"
LOG="${LOG:-$RESULTS/gpu_attention_${STAMP}.log}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2
limit=()
[ -n "${TIMEOUT:-}" ] && limit=(timeout "$TIMEOUT")

status=0
for backend in $BACKENDS; do
    echo "=== KERAS_BACKEND=$backend ===" | tee -a "$LOG"
    KERAS_BACKEND="$backend" "${limit[@]}" "$PYTHON" benchmarks/gpu_attention_benchmark.py \
        --json "$RESULTS/gpu_attention_${STAMP}_${backend}.json" "$@" 2>&1 \
        | grep --line-buffered -v '^USDT:' | tee -a "$LOG"
    rc=${PIPESTATUS[0]}
    [ "$rc" -ne 0 ] && status=$rc && echo "(KERAS_BACKEND=$backend exited $rc)" | tee -a "$LOG"
done
echo "log: $LOG"
exit $status
