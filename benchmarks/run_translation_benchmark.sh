#!/usr/bin/env bash
# Runs benchmarks/translation_benchmark.py once per Keras backend (jax,
# tensorflow, torch), each in its own process, and tees everything to one log.
# transformers (MarianMTModel.generate) is timed in the torch process; on jax
# and tensorflow its output is only the reference ours is checked against.
#
#   bash benchmarks/setup_bench_env.sh                   # once: creates .venv-bench
#   bash benchmarks/run_translation_benchmark.sh [extra flags for translation_benchmark.py]
#
# Env: VENV (default .venv-bench), RESULTS (default benchmarks/results),
# LOG (default $RESULTS/translation_<date>.log), BACKENDS (default "jax tensorflow torch").
set -uo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv-bench}"
BACKENDS="${BACKENDS:-jax tensorflow torch}"
RESULTS="${RESULTS:-benchmarks/results}"
mkdir -p "$RESULTS"
STAMP="$(date +%Y%m%d-%H%M%S)"
LOG="${LOG:-$RESULTS/translation_${STAMP}.log}"
# shellcheck disable=SC1091
. "$VENV/bin/activate"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export TF_CPP_MIN_LOG_LEVEL=2

status=0
for backend in $BACKENDS; do
    echo "=== KERAS_BACKEND=$backend ===" | tee -a "$LOG"
    KERAS_BACKEND="$backend" python benchmarks/translation_benchmark.py \
        --backend-label "$backend" --json "$RESULTS/translation_${STAMP}_${backend}.json" "$@" \
        2>&1 | tee -a "$LOG"
    rc=${PIPESTATUS[0]}
    [ "$rc" -ne 0 ] && status=$rc && echo "(KERAS_BACKEND=$backend exited $rc)" | tee -a "$LOG"
done
echo "log: $LOG"
exit $status
