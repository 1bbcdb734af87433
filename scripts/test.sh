#!/usr/bin/env bash
# Sets up ./.venv and runs the test suite once per Keras backend.
# Extra arguments go to pytest, e.g. scripts/test.sh -m "not slow".
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/setup_env.sh || exit 1
. .venv/bin/activate
export TF_CPP_MIN_LOG_LEVEL=2

failed=()
for backend in jax tensorflow torch; do
  echo "=== KERAS_BACKEND=$backend ==="
  KERAS_BACKEND=$backend python -m pytest -q -p no:cacheprovider "$@" || failed+=("$backend")
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "Tests failed on: ${failed[*]}"
  exit 1
fi
echo "All tests passed on jax, tensorflow and torch."
