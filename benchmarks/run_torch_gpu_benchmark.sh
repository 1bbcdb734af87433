#!/usr/bin/env bash
# Issue 20's GPU measurements, on a machine with a CUDA GPU and torch,
# transformers and (carried) keras: the CUDA tests of the recorded decoding
# loop, then GPT-2 small generation and BERT-base forward / train step
# against transformers, each part under its own time limit so that one hang
# leaves the others' results. Logs and JSON go to $RESULTS.
#
#   RESULTS=benchmarks/results PARTS="tests gpt bert" bash benchmarks/run_torch_gpu_benchmark.sh
#
# Parts (PARTS, default all, in this order): tests; gpt (batch 1, 8, 32,
# ours with and without jit_compile against transformers' static cache);
# gpt_eager (ours and transformers eager); bert (forward at 128 and 512,
# train step at 128, as recorded); bert_jit (the same with jit_compile=True);
# profile (the kernels of one forward at 512, ours and transformers).
set -u
cd "$(dirname "$0")/.."
RESULTS="${RESULTS:-benchmarks/results}"
PYTHON="${PYTHON:-python3}"
PARTS="${PARTS:-tests gpt gpt_eager bert bert_jit profile}"
mkdir -p "$RESULTS"
export KERAS_BACKEND=torch PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
LOG="$RESULTS/torch_gpu.log"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee -a "$LOG"
GPT=("$PYTHON" benchmarks/gpt_generation_benchmark.py --dtype bfloat16 --batch-sizes 1 8 32 --prompt-len 32
     --new-tokens 128 --warmup 2 --repeats 3)
BERT=("$PYTHON" benchmarks/bert_benchmark.py --batch-size 32 --outputs device --warmup 3 --repeats 20 --dtype bfloat16)

for part in $PARTS; do
  case $part in
    tests) timeout 75 "$PYTHON" -m pytest -q -p no:cacheprovider -rs tests/models/test_recorded_decoding.py ;;
    gpt) timeout 170 "${GPT[@]}" --contenders ours,ours_compiled,transformers_static --json "$RESULTS/gpt_bf16.json" ;;
    gpt_eager) timeout 120 "${GPT[@]}" --contenders ours,transformers --json "$RESULTS/gpt_bf16_eager.json" ;;
    bert)
      timeout 140 "${BERT[@]}" --seq-len 128 --modes inference,training \
          --contenders ours,transformers,transformers_compiled --json "$RESULTS/bert_bf16_128.json"
      timeout 95 "${BERT[@]}" --seq-len 512 --modes inference \
          --contenders ours,transformers,transformers_compiled --json "$RESULTS/bert_bf16_512.json" ;;
    bert_jit)
      timeout 100 "${BERT[@]}" --seq-len 512 --modes inference --jit-compile true \
          --contenders ours,transformers_compiled --json "$RESULTS/bert_bf16_512_jit.json"
      timeout 150 "${BERT[@]}" --seq-len 128 --modes training --jit-compile true \
          --contenders ours,transformers --json "$RESULTS/bert_bf16_128_train_jit.json" ;;
    profile) timeout 60 "$PYTHON" benchmarks/profile_bert_kernels.py --seq-len 512 --dtype bfloat16 ;;
    *) echo "unknown part: $part" ;;
  esac 2>&1 | tee -a "$LOG"
done
