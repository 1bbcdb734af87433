#!/usr/bin/env bash
# Runs benchmarks/linear_generation_benchmark.py once per Keras backend (jax,
# tensorflow, torch), tees everything to one log, then draws every backend's
# results into one plot.
#
#   bash benchmarks/setup_bench_env.sh                          # once: creates .venv-bench
#   bash benchmarks/run_linear_generation_benchmark.sh [extra flags for linear_generation_benchmark.py]
#
# Env: VENV (default .venv-bench), RESULTS (default benchmarks/results),
# LOG (default $RESULTS/linear_generation_<date>.log), BACKENDS (default
# "jax tensorflow torch"), PLOT (default docs/linear_generation.png).
set -uo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv-bench}"
BACKENDS="${BACKENDS:-jax tensorflow torch}"
RESULTS="${RESULTS:-benchmarks/results}"
PLOT="${PLOT:-docs/linear_generation.png}"
mkdir -p "$RESULTS"
STAMP="$(date +%Y%m%d-%H%M%S)"
LOG="${LOG:-$RESULTS/linear_generation_${STAMP}.log}"
# shellcheck disable=SC1091
. "$VENV/bin/activate"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export TF_CPP_MIN_LOG_LEVEL=2

status=0
jsons=()
for backend in $BACKENDS; do
    json="$RESULTS/linear_generation_${STAMP}_${backend}.json"
    echo "=== KERAS_BACKEND=$backend ===" | tee -a "$LOG"
    KERAS_BACKEND="$backend" python benchmarks/linear_generation_benchmark.py \
        --backend-label "$backend" --json "$json" "$@" 2>&1 | tee -a "$LOG"
    rc=${PIPESTATUS[0]}
    [ "$rc" -ne 0 ] && status=$rc && echo "(KERAS_BACKEND=$backend exited $rc)" | tee -a "$LOG"
    [ -f "$json" ] && jsons+=("$json")
done
if [ "${#jsons[@]}" -gt 0 ]; then
    python benchmarks/linear_generation_benchmark.py --replot "${jsons[@]}" --plot "$PLOT" 2>&1 | tee -a "$LOG"
fi
echo "log: $LOG"
exit $status
