#!/usr/bin/env bash
# The one runner of the benchmarks: sets up the benchmarking venv, runs a
# benchmark once per Keras backend, each in its own process, tees everything
# to one log and writes one JSON per backend (and, for the sweeps, one plot
# of every backend's results).
#
#   bash benchmarks/run.sh setup                   # creates .venv-bench (a first run does it too)
#   bash benchmarks/run.sh NAME [flags for benchmarks/NAME_benchmark.py]
#   bash benchmarks/run.sh torch_gpu               # issue 20's torch GPU measurements (below)
#   bash benchmarks/run.sh jax_gpu                 # issue 22's JAX GPU measurements (below)
#
# NAME                 backends (BACKENDS)      also
# bert                 jax tensorflow torch
# gpt_generation       jax tensorflow torch
# streaming            jax tensorflow torch
# decoding_controls    jax tensorflow torch
# train_on_batch_overhead jax tensorflow torch
# vit                  jax tensorflow torch
# translation          jax tensorflow torch
# transformer_xl_eval  jax tensorflow torch
# attention_scaling    jax tensorflow torch     plot PLOT (docs/attention_scaling.png)
# linear_generation    jax tensorflow torch     plot PLOT (docs/linear_generation.png)
# reformer             jax torch tensorflow     plot PLOT (docs/reformer_scaling.png); the enwik8-shaped
#                                               64K forward on ENWIK8_BACKENDS (jax); under `nice -n $NICE` (10)
# gpu_attention        torch jax                a GPU machine; no --backend-label; USDT: lines dropped
#
# Each backend runs `KERAS_BACKEND=<backend> $PYTHON -m benchmarks.NAME_benchmark
# --backend-label <backend> --json $RESULTS/NAME_<stamp>_<backend>.json [flags]`;
# the log is $RESULTS/NAME_<stamp>.log. The exit status is that of the last
# backend that failed (0 if none did).
#
# Env: VENV (default .venv-bench); PYTHON (the interpreter that runs the
# benchmark; default $VENV/bin/python, the venv created first where it does
# not exist; for gpu_attention python3 where there is no venv, and for
# torch_gpu python3; with `setup`, the interpreter the venv is made from,
# default python3); RESULTS (default benchmarks/results); LOG (default
# $RESULTS/NAME_<stamp>.log); BACKENDS; TIMEOUT (seconds per backend; default
# none); PLOT, ENWIK8_BACKENDS and NICE as above.
#
# torch_gpu (issue 20's GPU measurements, on a machine with a CUDA GPU and
# torch, transformers and (carried) keras): the CUDA tests of the recorded
# decoding loop, then GPT-2 small generation and BERT-base forward / train
# step against transformers, each part under its own time limit so that one
# hang leaves the others' results. Logs (appended to $RESULTS/torch_gpu.log,
# or LOG) and JSON go to $RESULTS.
#
#   RESULTS=benchmarks/results PARTS="tests gpt bert_forward" bash benchmarks/run.sh torch_gpu
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
#
# jax_gpu (issue 22's GPU measurements, on a machine with a CUDA GPU and jax,
# and (carried) keras, keras-hub, kagglehub): parts (PARTS, default all):
# tests (the JAX tests of cuDNN's attention with key lengths, and of BERT
# with its padding moved last, on the GPU);
# gpt (GPT-2 small greedy, batch 1, 8 and 32: GPT_CONTENDERS, default ours,
# ours with cuDNN's attention given the mask alone, KerasHub);
# gpt_command_buffers (ours with XLA's command buffers for while loops and
# conditionals, XLA_FLAGS); bert_128 (BERT-base forward and mixed-precision
# train step at 128, batch 32: BERT_CONTENDERS, default ours, ours built
# with the padding in place (its mask to the blocks, not moved last),
# ours with cuDNN's attention given the padding mask alone, KerasHub);
# bert_512 (the forward at 512); bert_forward (the forward at 128 and 512);
# profile (`profile_jax_gpu.py`: kernels of one
# GPT-2 generate at batch 1, ours with and without two-row projections, and
# of one BERT forward at 128, ours and KerasHub, whose optimized HLO it
# writes to $RESULTS); profile_train (kernels and Python calls of five
# BERT-base `train_on_batch` steps at 128, ours and KerasHub);
# train_ftz_atomics (profile_train, then bert_128's train step, with
# XLA_FLAGS=--xla_backend_extra_options=-nvptx-allow-ftz-atomics: native
# float32 atomics in scatter-adds, jax-ml/jax#38806, where jaxlib 0.10.2
# and later compile them as compare-and-swap loops; the embedding
# gradient's scatter, bfloat16 then, took 10 of 21 ms of kernel time per
# step on the H200); train_embedding_gradients (the train step at 128,
# ours against ours with the embedding gradient as one-hot matrix products
# or summed by id after sorting (no atomic adds), and KerasHub; then the
# kernels of the three forms of ours); profile_decode (every kernel of a
# batch-1 GPT-2 decoding step, ours, by name; XLA's optimized programs, in
# which the kernels are named, to $RESULTS/decode_hlo_$DTYPE.tar.gz).
# DTYPE as for torch_gpu. Logs (appended to $RESULTS/jax_gpu.log, or LOG)
# and JSON go to $RESULTS.
set -uo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv-bench}"
RESULTS="${RESULTS:-benchmarks/results}"

usage() {
    sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
    exit 2
}

# Creates the benchmarking venv at $VENV, separate from the package's own
# venv: keras-hub and transformers stay out of the package's dependencies
# (they are the `bench` extra of pyproject.toml).
#
# torch is pinned and installed FIRST: torch==2.13.0 is the CPU build (on this
# machine pip takes it from a local wheel); an unpinned `torch` pulled in by
# another requirement would fetch a multi-GB CUDA build instead.
setup() {
    (
        set -euo pipefail
        "${PYTHON:-python3}" -m venv "$VENV"
        # shellcheck disable=SC1091
        . "$VENV/bin/activate"
        python -m pip install --upgrade pip
        pip install "torch==2.13.0"
        # keras-hub may pull tensorflow-text, which pins a `tensorflow` version; if
        # that conflicts with tensorflow-cpu, pip resolves it (possibly installing
        # `tensorflow` instead, which runs on the CPU just the same).
        pip install "torch==2.13.0" "jax[cpu]" tensorflow-cpu keras keras-hub transformers \
            tokenizers safetensors huggingface_hub matplotlib
        # The package itself, without re-resolving its dependencies (they are above).
        pip install --no-deps -e .
        pip list 2>/dev/null | grep -iE '^(torch|jax|jaxlib|tensorflow.*|keras.*|transformers|numpy|matplotlib) '
    )
}

# Issue 20's parts (see the header); $PYTHON, $RESULTS, $LOG set.
torch_gpu() {
    local dtype="${DTYPE:-bfloat16}"
    local parts="${PARTS:-tests gpt gpt_eager profile_gpt bert_forward bert_jit_forward bert_train bert_jit_train profile_bert profile_bert_jit}"
    export KERAS_BACKEND=torch
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee -a "$LOG"
    local gpt=("$PYTHON" -m benchmarks.gpt_generation_benchmark --dtype "$dtype" --batch-sizes 1 8 32 --prompt-len 32
               --new-tokens 128 --warmup 2 --repeats 3)
    local bert=("$PYTHON" -m benchmarks.bert_benchmark --batch-size 32 --outputs device --warmup 3 --repeats 20
                --dtype "$dtype")

    bert_forward() {  # $1: jit_compile, $2: contenders; the forward at 128 and 512
        for length in 128 512; do
            timeout 100 "${bert[@]}" --seq-len $length --modes inference --jit-compile "$1" \
                --contenders "$2" --json "$RESULTS/bert_${dtype}_${length}_jit_$1.json"
        done
    }

    for part in $parts; do
        echo "## part $part ($dtype), $(date -u +%T)"
        case $part in
            tests) timeout 150 "$PYTHON" -m pytest -q -p no:cacheprovider -rs -m "not slow" \
                tests/models/test_recorded_decoding.py tests/models/test_traced_steps.py ;;
            gpt) timeout 170 "${gpt[@]}" --contenders ours,ours_compiled,transformers_static \
                --json "$RESULTS/gpt_$dtype.json" ;;
            gpt_eager) timeout 120 "${gpt[@]}" --contenders ours,transformers --json "$RESULTS/gpt_${dtype}_eager.json" ;;
            profile_gpt) timeout 120 "$PYTHON" -m benchmarks.profile_gpt_decoding --dtype "$dtype" --batch-sizes 1 8 \
                --contenders ours,ours_compiled ;;
            bert_forward) bert_forward auto ours,transformers,transformers_compiled ;;
            bert_jit_forward) bert_forward true ours,transformers_compiled ;;
            bert_train) timeout 100 "${bert[@]}" --seq-len 128 --modes training \
                --contenders ours,transformers --json "$RESULTS/bert_${dtype}_128_train.json" ;;
            bert_jit_train) timeout 150 "${bert[@]}" --seq-len 128 --modes training --jit-compile true \
                --contenders ours,transformers --json "$RESULTS/bert_${dtype}_128_train_jit.json" ;;
            profile_bert) timeout 60 "$PYTHON" -m benchmarks.profile_bert_kernels --seq-len 512 --dtype "$dtype" ;;
            profile_bert_jit) timeout 90 "$PYTHON" -m benchmarks.profile_bert_kernels --seq-len 128 --dtype "$dtype" \
                --jit-compile ;;
            *) echo "unknown part: $part" ;;
        esac 2>&1 | tee -a "$LOG"
    done
}

# Issue 22's parts (see the header); $PYTHON, $RESULTS, $LOG set.
jax_gpu() {
    local dtype="${DTYPE:-bfloat16}"
    local parts="${PARTS:-tests gpt gpt_command_buffers bert_128 bert_512 profile}"
    export KERAS_BACKEND=jax
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee -a "$LOG"
    local gpt=("$PYTHON" -m benchmarks.gpt_generation_benchmark --dtype "$dtype" --prompt-len 32 --new-tokens 128
               --warmup 2 --repeats 5)
    local bert=("$PYTHON" -m benchmarks.bert_benchmark --batch-size 32 --outputs device --warmup 3 --repeats 20
                --dtype "$dtype" --contenders "${BERT_CONTENDERS:-ours,ours_padding_in_place,ours_mask_only,keras_hub}")
    local command_buffers="FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,WHILE,CONDITIONAL"

    for part in $parts; do
        echo "## part $part ($dtype), $(date -u +%T)"
        case $part in
            tests) timeout 120 "$PYTHON" -m pytest -q -p no:cacheprovider -rs tests/attention/test_key_lengths.py \
                tests/attention/test_softmax.py tests/layers/test_padding_last.py ;;
            gpt) timeout 170 "${gpt[@]}" --batch-sizes 1 8 32 --contenders "${GPT_CONTENDERS:-ours,ours_mask_only,keras_hub}" \
                --json "$RESULTS/jax_gpt_$dtype.json" ;;
            gpt_command_buffers) XLA_FLAGS="--xla_gpu_enable_command_buffer=$command_buffers" timeout 80 \
                "${gpt[@]}" --batch-sizes 1 32 --contenders ours --json "$RESULTS/jax_gpt_${dtype}_command_buffers.json" ;;
            bert_128) timeout 240 "${bert[@]}" --seq-len 128 --modes inference,training \
                --json "$RESULTS/jax_bert_${dtype}_128.json" ;;
            bert_512) timeout 90 "${bert[@]}" --seq-len 512 --modes inference --json "$RESULTS/jax_bert_${dtype}_512.json" ;;
            bert_forward) for length in 128 512; do
                    timeout 70 "${bert[@]}" --seq-len $length --modes inference --json "$RESULTS/jax_bert_${dtype}_$length.json"
                done ;;
            profile) timeout 120 "$PYTHON" -m benchmarks.profile_jax_gpu --dtype "$dtype" --batch-sizes 1 \
                --gpt-contenders ours,ours_one_row_products --seq-lens 128 --dump-hlo "$RESULTS" ;;
            profile_train) timeout 150 "$PYTHON" -m benchmarks.profile_jax_gpu --dtype "$dtype" --parts train \
                --seq-lens 128 ;;
            train_ftz_atomics) (
                    export XLA_FLAGS="${XLA_FLAGS:-} --xla_backend_extra_options=-nvptx-allow-ftz-atomics"
                    timeout 150 "$PYTHON" -m benchmarks.profile_jax_gpu --dtype "$dtype" --parts train --seq-lens 128
                    timeout 150 "${bert[@]}" --seq-len 128 --modes training \
                        --json "$RESULTS/jax_bert_${dtype}_128_train_ftz_atomics.json"
                ) ;;
            train_embedding_gradients)
                local gradients=ours,ours_one_hot_embedding_gradient,ours_sorted_embedding_gradient
                timeout 200 "${bert[@]}" --seq-len 128 --modes training --contenders "$gradients,keras_hub" \
                    --json "$RESULTS/jax_bert_${dtype}_128_train_embedding_gradients.json"
                timeout 150 "$PYTHON" -m benchmarks.profile_jax_gpu --dtype "$dtype" --parts train --seq-lens 128 \
                    --bert-contenders "$gradients" ;;
            profile_decode) (
                    # XLA's own dump of every optimized program, where the kernels are named
                    local dump="$RESULTS/decode_hlo"
                    export XLA_FLAGS="${XLA_FLAGS:-} --xla_dump_to=$dump --xla_dump_hlo_as_text --xla_dump_hlo_pass_re=^$"
                    timeout 90 "$PYTHON" -m benchmarks.profile_jax_gpu --dtype "$dtype" --parts gpt \
                        --batch-sizes 1 --gpt-contenders ours --rows 300
                    find "$dump" -type f ! -name '*after_optimizations.txt' -delete
                    tar -czf "$RESULTS/decode_hlo_${dtype}.tar.gz" -C "$dump" . && rm -rf "$dump"
                ) ;;
            *) echo "unknown part: $part" ;;
        esac 2>&1 | grep --line-buffered -v '^USDT:' | tee -a "$LOG"
    done
}

NAME="${1:-}"
[ -n "$NAME" ] || usage
shift
plot_default=""
backend_label=yes
nice=()
case "$NAME" in
    setup) setup; exit $? ;;
    -h|--help|help) usage ;;
    bert|gpt_generation|streaming|decoding_controls|translation|transformer_xl_eval|train_on_batch_overhead|vit)
        default_backends="jax tensorflow torch" ;;
    attention_scaling|linear_generation) default_backends="jax tensorflow torch"; plot_default="docs/$NAME.png" ;;
    reformer)
        default_backends="jax torch tensorflow"
        plot_default="docs/reformer_scaling.png"
        ENWIK8_BACKENDS="${ENWIK8_BACKENDS:-jax}"
        nice=(nice -n "${NICE:-10}")
        ;;
    gpu_attention) default_backends="torch jax"; backend_label=no ;;
    torch_gpu|jax_gpu) ;;
    *) echo "unknown benchmark: $NAME" >&2; usage ;;
esac

if [ -z "${PYTHON:-}" ]; then
    case "$NAME" in
        torch_gpu|jax_gpu) PYTHON=python3 ;;
        gpu_attention) if [ -x "$VENV/bin/python" ]; then PYTHON="$VENV/bin/python"; else PYTHON=python3; fi ;;
        *)
            if [ ! -x "$VENV/bin/python" ]; then
                echo "no $VENV: creating it first (bash benchmarks/run.sh setup)"
                setup || exit $?
            fi
            PYTHON="$VENV/bin/python"
            ;;
    esac
fi
mkdir -p "$RESULTS"
# The repository first on the path: `benchmarks` and the library import
# without an install (on a GPU machine that carries its packages).
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2

if [ "$NAME" = torch_gpu ] || [ "$NAME" = jax_gpu ]; then
    LOG="${LOG:-$RESULTS/$NAME.log}"
    "$NAME"
    exit 0
fi

BACKENDS="${BACKENDS:-$default_backends}"
STAMP="$(date +%Y%m%d-%H%M%S)"
LOG="${LOG:-$RESULTS/${NAME}_${STAMP}.log}"
limit=()
[ -n "${TIMEOUT:-}" ] && limit=(timeout "$TIMEOUT")

status=0
jsons=()
for backend in $BACKENDS; do
    json="$RESULTS/${NAME}_${STAMP}_${backend}.json"
    flags=(--json "$json")
    [ "$backend_label" = yes ] && flags=(--backend-label "$backend" "${flags[@]}")
    if [ "$NAME" = reformer ]; then
        parts="sweep"
        case " $ENWIK8_BACKENDS " in *" $backend "*) parts="sweep,enwik8" ;; esac
        flags=(--parts "$parts" "${flags[@]}")
    fi
    echo "=== KERAS_BACKEND=$backend ===" | tee -a "$LOG"
    KERAS_BACKEND="$backend" "${limit[@]}" "${nice[@]}" "$PYTHON" -m "benchmarks.${NAME}_benchmark" \
        "${flags[@]}" "$@" 2>&1 | grep --line-buffered -v '^USDT:' | tee -a "$LOG"
    rc=${PIPESTATUS[0]}
    [ "$rc" -ne 0 ] && status=$rc && echo "(KERAS_BACKEND=$backend exited $rc)" | tee -a "$LOG"
    [ -f "$json" ] && jsons+=("$json")
done
if [ -n "$plot_default" ] && [ "${#jsons[@]}" -gt 0 ]; then
    "$PYTHON" -m "benchmarks.${NAME}_benchmark" --replot "${jsons[@]}" --plot "${PLOT:-$plot_default}" 2>&1 \
        | tee -a "$LOG"
fi
echo "log: $LOG"
exit $status
