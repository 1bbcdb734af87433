#!/usr/bin/env bash
# Runs benchmarks/reformer_benchmark.py once per Keras backend (jax, torch,
# tensorflow; one after another, never in parallel), tees everything to one
# log, then draws every backend's sweep into one plot. The enwik8-shaped
# 64K-token forward runs on the backends in ENWIK8_BACKENDS (default: jax).
#
#   bash benchmarks/setup_bench_env.sh                     # once: creates .venv-bench
#   bash benchmarks/run_reformer_benchmark.sh [extra flags for reformer_benchmark.py]
#
# Env: VENV (default .venv-bench), RESULTS (default benchmarks/results),
# LOG (default $RESULTS/reformer_<date>.log), BACKENDS (default
# "jax torch tensorflow"), ENWIK8_BACKENDS (default "jax"), PLOT (default
# docs/reformer_scaling.png), NICE (default 10: the benchmark runs under
# `nice -n $NICE`).
set -uo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv-bench}"
BACKENDS="${BACKENDS:-jax torch tensorflow}"
ENWIK8_BACKENDS="${ENWIK8_BACKENDS:-jax}"
RESULTS="${RESULTS:-benchmarks/results}"
PLOT="${PLOT:-docs/reformer_scaling.png}"
NICE="${NICE:-10}"
mkdir -p "$RESULTS"
STAMP="$(date +%Y%m%d-%H%M%S)"
LOG="${LOG:-$RESULTS/reformer_${STAMP}.log}"
# shellcheck disable=SC1091
. "$VENV/bin/activate"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export TF_CPP_MIN_LOG_LEVEL=2

status=0
jsons=()
for backend in $BACKENDS; do
    json="$RESULTS/reformer_${STAMP}_${backend}.json"
    parts="sweep"
    case " $ENWIK8_BACKENDS " in *" $backend "*) parts="sweep,enwik8" ;; esac
    echo "=== KERAS_BACKEND=$backend ===" | tee -a "$LOG"
    KERAS_BACKEND="$backend" nice -n "$NICE" python benchmarks/reformer_benchmark.py \
        --parts "$parts" --backend-label "$backend" --json "$json" "$@" 2>&1 | tee -a "$LOG"
    rc=${PIPESTATUS[0]}
    [ "$rc" -ne 0 ] && status=$rc && echo "(KERAS_BACKEND=$backend exited $rc)" | tee -a "$LOG"
    [ -f "$json" ] && jsons+=("$json")
done
if [ "${#jsons[@]}" -gt 0 ]; then
    python benchmarks/reformer_benchmark.py --replot "${jsons[@]}" --plot "$PLOT" 2>&1 | tee -a "$LOG"
fi
echo "log: $LOG"
exit $status
