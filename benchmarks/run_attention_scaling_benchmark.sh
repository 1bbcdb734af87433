#!/usr/bin/env bash
# Runs benchmarks/attention_scaling_benchmark.py once per Keras backend (jax,
# tensorflow, torch), tees everything to one log, then draws every backend's
# results into one plot.
#
#   bash benchmarks/setup_bench_env.sh                          # once: creates .venv-bench
#   bash benchmarks/run_attention_scaling_benchmark.sh [extra flags for attention_scaling_benchmark.py]
#
# Env: VENV (default .venv-bench), RESULTS (default benchmarks/results),
# LOG (default $RESULTS/attention_scaling_<date>.log), BACKENDS (default
# "jax tensorflow torch"), PLOT (default docs/attention_scaling.png).
set -uo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv-bench}"
BACKENDS="${BACKENDS:-jax tensorflow torch}"
RESULTS="${RESULTS:-benchmarks/results}"
PLOT="${PLOT:-docs/attention_scaling.png}"
mkdir -p "$RESULTS"
STAMP="$(date +%Y%m%d-%H%M%S)"
LOG="${LOG:-$RESULTS/attention_scaling_${STAMP}.log}"
# shellcheck disable=SC1091
. "$VENV/bin/activate"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export TF_CPP_MIN_LOG_LEVEL=2

status=0
jsons=()
for backend in $BACKENDS; do
    json="$RESULTS/attention_scaling_${STAMP}_${backend}.json"
    echo "=== KERAS_BACKEND=$backend ===" | tee -a "$LOG"
    KERAS_BACKEND="$backend" python benchmarks/attention_scaling_benchmark.py \
        --backend-label "$backend" --json "$json" "$@" 2>&1 | tee -a "$LOG"
    rc=${PIPESTATUS[0]}
    [ "$rc" -ne 0 ] && status=$rc && echo "(KERAS_BACKEND=$backend exited $rc)" | tee -a "$LOG"
    [ -f "$json" ] && jsons+=("$json")
done
if [ "${#jsons[@]}" -gt 0 ]; then
    python benchmarks/attention_scaling_benchmark.py --replot "${jsons[@]}" --plot "$PLOT" 2>&1 | tee -a "$LOG"
fi
echo "log: $LOG"
exit $status
