#!/usr/bin/env bash
# Runs benchmarks/transformer_xl_eval_benchmark.py once per Keras backend
# (jax, tensorflow, torch) and tees everything to one log.
#
#   bash benchmarks/setup_bench_env.sh                          # once: creates .venv-bench
#   bash benchmarks/run_transformer_xl_eval_benchmark.sh [extra flags for transformer_xl_eval_benchmark.py]
#
# Env: VENV (default .venv-bench), RESULTS (default benchmarks/results),
# LOG (default $RESULTS/transformer_xl_eval_<date>.log), BACKENDS (default
# "jax tensorflow torch").
set -uo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv-bench}"
BACKENDS="${BACKENDS:-jax tensorflow torch}"
RESULTS="${RESULTS:-benchmarks/results}"
mkdir -p "$RESULTS"
STAMP="$(date +%Y%m%d-%H%M%S)"
LOG="${LOG:-$RESULTS/transformer_xl_eval_${STAMP}.log}"
# shellcheck disable=SC1091
. "$VENV/bin/activate"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export TF_CPP_MIN_LOG_LEVEL=2

status=0
for backend in $BACKENDS; do
    json="$RESULTS/transformer_xl_eval_${STAMP}_${backend}.json"
    echo "=== KERAS_BACKEND=$backend ===" | tee -a "$LOG"
    KERAS_BACKEND="$backend" python benchmarks/transformer_xl_eval_benchmark.py \
        --backend-label "$backend" --json "$json" "$@" 2>&1 | tee -a "$LOG"
    rc=${PIPESTATUS[0]}
    [ "$rc" -ne 0 ] && status=$rc && echo "(KERAS_BACKEND=$backend exited $rc)" | tee -a "$LOG"
done
echo "log: $LOG"
exit $status
