#!/usr/bin/env bash
# Issue 20's GPU measurements, on a machine with a CUDA GPU and torch,
# transformers and (carried) keras: the CUDA tests of the recorded decoding
# loop, then GPT-2 small generation and BERT-base forward / train step
# against transformers, each part under its own time limit so that one hang
# leaves the others' results. Logs and JSON go to $RESULTS.
#
#   RESULTS=benchmarks/results PARTS="tests gpt bert_forward" bash benchmarks/run_torch_gpu_benchmark.sh
#
# DTYPE (bfloat16, the default, or float32) is every part's precision.
# Parts (PARTS, default all, in this order): tests (the CUDA tests of the
# recorded steps and decoding loop); gpt (GPT-2 small greedy, batch 1, 8
# and 32, ours with and without jit_compile against transformers' static
# cache); gpt_eager (ours and transformers eager); profile_gpt (host- or
# GPU-bound: wall against kernel time per token, batch 1 and 8);
# bert_forward / bert_jit_forward (BERT-base forward at 128 and 512, ours
# recorded / with jit_compile=True, against transformers eager and
# compiled); bert_train / bert_jit_train (the train step at 128);
# profile_bert (the kernels of one eager forward at 512), profile_bert_jit
# (of one compiled forward at 128).
set -u
cd "$(dirname "$0")/.."
RESULTS="${RESULTS:-benchmarks/results}"
PYTHON="${PYTHON:-python3}"
DTYPE="${DTYPE:-bfloat16}"
PARTS="${PARTS:-tests gpt gpt_eager profile_gpt bert_forward bert_jit_forward bert_train bert_jit_train profile_bert profile_bert_jit}"
mkdir -p "$RESULTS"
export KERAS_BACKEND=torch PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
LOG="$RESULTS/torch_gpu.log"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee -a "$LOG"
GPT=("$PYTHON" benchmarks/gpt_generation_benchmark.py --dtype "$DTYPE" --batch-sizes 1 8 32 --prompt-len 32
     --new-tokens 128 --warmup 2 --repeats 3)
BERT=("$PYTHON" benchmarks/bert_benchmark.py --batch-size 32 --outputs device --warmup 3 --repeats 20 --dtype "$DTYPE")

bert_forward() {  # $1: jit_compile, $2: contenders; the forward at 128 and 512
  for length in 128 512; do
    timeout 100 "${BERT[@]}" --seq-len $length --modes inference --jit-compile "$1" \
        --contenders "$2" --json "$RESULTS/bert_${DTYPE}_${length}_jit_$1.json"
  done
}

for part in $PARTS; do
  echo "## part $part ($DTYPE), $(date -u +%T)"
  case $part in
    tests) timeout 150 "$PYTHON" -m pytest -q -p no:cacheprovider -rs -m "not slow" \
        tests/models/test_recorded_decoding.py tests/models/test_traced_steps.py ;;
    gpt) timeout 170 "${GPT[@]}" --contenders ours,ours_compiled,transformers_static --json "$RESULTS/gpt_$DTYPE.json" ;;
    gpt_eager) timeout 120 "${GPT[@]}" --contenders ours,transformers --json "$RESULTS/gpt_${DTYPE}_eager.json" ;;
    profile_gpt) timeout 120 "$PYTHON" benchmarks/profile_gpt_decoding.py --dtype "$DTYPE" --batch-sizes 1 8 \
        --contenders ours,ours_compiled ;;
    bert_forward) bert_forward auto ours,transformers,transformers_compiled ;;
    bert_jit_forward) bert_forward true ours,transformers_compiled ;;
    bert_train) timeout 100 "${BERT[@]}" --seq-len 128 --modes training \
        --contenders ours,transformers --json "$RESULTS/bert_${DTYPE}_128_train.json" ;;
    bert_jit_train) timeout 150 "${BERT[@]}" --seq-len 128 --modes training --jit-compile true \
        --contenders ours,transformers --json "$RESULTS/bert_${DTYPE}_128_train_jit.json" ;;
    profile_bert) timeout 60 "$PYTHON" benchmarks/profile_bert_kernels.py --seq-len 512 --dtype "$DTYPE" ;;
    profile_bert_jit) timeout 90 "$PYTHON" benchmarks/profile_bert_kernels.py --seq-len 128 --dtype "$DTYPE" \
        --jit-compile ;;
    *) echo "unknown part: $part" ;;
  esac 2>&1 | tee -a "$LOG"
done
