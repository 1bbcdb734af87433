#!/usr/bin/env bash
# Sets up ./.venv and runs the test suite once per Keras backend, each run on
# $TEST_WORKERS pytest-xdist processes (default: one per core, at most 4).
#
# The end-to-end tests (marked `slow`: training runs that must learn, the
# wheel, the documentation build and its examples, the docstring examples)
# run on torch only: what they exercise per backend (fit, generate, parity)
# the other tests check on all three, so their runs on JAX and TensorFlow
# would add minutes and no coverage. So do the tests marked
# `backend_independent` (the hub's files, HTTP and error messages).
# Extra arguments go to pytest after these, so they win: e.g.
# scripts/test.sh -m "not slow" skips the end-to-end tests everywhere.
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/setup_env.sh || exit 1
. .venv/bin/activate
export TF_CPP_MIN_LOG_LEVEL=2

cores=$(python -c "import os; print(len(os.sched_getaffinity(0)))")
workers=${TEST_WORKERS:-$(( cores < 4 ? cores : 4 ))}
# Each worker gets its share of the cores: torch's OpenMP threads spin while
# they wait, so two workers of two threads each on two cores run the torch
# tests about twice as slowly as with one thread each.
threads=$(( cores / workers > 0 ? cores / workers : 1 ))
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$threads}

# JAX's workers share a compilation cache for this run: the same tiny models
# built in many test files compile to the same programs (about 10 % of the
# JAX run).
jax_cache=$(mktemp -d)
trap 'rm -rf "$jax_cache"' EXIT

failed=()
for backend in jax tensorflow torch; do
  echo "=== KERAS_BACKEND=$backend ==="
  selection=()
  [ "$backend" != torch ] && selection=(-m "not slow and not backend_independent")
  backend_env=("KERAS_BACKEND=$backend")
  # JAX gets 8 CPU devices (tests/models/test_distribution.py shards models
  # over a mesh of 8) and XLA without most optimizations: the tiny models'
  # programs compile several times faster, and compiling is most of the run.
  # JAX compiles every operation it runs eagerly once per shape, and XLA's
  # older CPU code emitters (`--xla_cpu_use_fusion_emitters=false`, not its
  # MLIR fusion emitters) compile one such operation in about 22 ms instead
  # of 36: on a 2-core CPU the JAX run takes 1,389 s instead of 1,958 s.
  [ "$backend" = jax ] && backend_env+=(
    "XLA_FLAGS=${XLA_FLAGS:+$XLA_FLAGS }--xla_force_host_platform_device_count=8 --xla_cpu_use_fusion_emitters=false"
    "JAX_DISABLE_MOST_OPTIMIZATIONS=${JAX_DISABLE_MOST_OPTIMIZATIONS:-1}"
    "JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-$jax_cache}"
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0"
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=0"
  )
  # TensorFlow's XLA-compiled steps likewise, with the flags that
  # JAX_DISABLE_MOST_OPTIMIZATIONS sets (about 20 % faster) and the older
  # code emitters (936 s instead of 1,149 s).
  [ "$backend" = tensorflow ] && backend_env+=(
    "XLA_FLAGS=${XLA_FLAGS:+$XLA_FLAGS }--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true --xla_cpu_use_fusion_emitters=false"
  )
  start=$SECONDS
  # Work stealing: each worker starts on its half of the tests in file order
  # (a file's module fixtures are mostly built once) and an idle worker takes
  # half of what the other has left, so a long file (the notebooks: about 4
  # minutes on torch) no longer keeps one worker busy after the other is done.
  env "${backend_env[@]}" python -m pytest -q -p no:cacheprovider -n "$workers" --dist worksteal \
    "${selection[@]}" "$@" || failed+=("$backend")
  echo "=== KERAS_BACKEND=$backend took $(( SECONDS - start )) s ==="
done
# LiteRT from torch needs litert-torch, which cannot share ./.venv (see
# scripts/setup_litert_env.sh): its one test file runs in ./.venv-litert.
echo "=== LiteRT export from torch (.venv-litert) ==="
start=$SECONDS
if scripts/setup_litert_env.sh; then
  KERAS_BACKEND=torch .venv-litert/bin/python -m pytest -q -p no:cacheprovider \
    tests/models/test_litert_torch_export.py || failed+=("torch (LiteRT)")
else
  failed+=("torch (LiteRT setup)")
fi
echo "=== LiteRT export from torch took $(( SECONDS - start )) s ==="
if [ ${#failed[@]} -gt 0 ]; then
  echo "Tests failed on: ${failed[*]}"
  exit 1
fi
echo "All tests passed on jax, tensorflow and torch (and LiteRT from torch)."
