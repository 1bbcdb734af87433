"""Where a JAX program's time goes on a GPU (issue 22): for GPT-2 small's
greedy `generate`, a BERT-base forward and a BERT-base `train_on_batch`
(mixed bfloat16 with `--dtype bfloat16`), ours against KerasHub's, one
call's wall time (and, for training, the process's CPU time) against the
GPU's kernel time, the kernels it runs and the largest of them, read from the JAX profiler's trace
(`jax.profiler.trace(..., create_perfetto_trace=True)`: the kernels are the
complete events on the GPU's stream lines). Kernel time far below wall time
means the GPU idles between kernels (launches, host syncs); kernel time
close to it means fewer or faster kernels are what would help. Same models,
inputs and calls as `gpt_generation_benchmark.py` and `bert_benchmark.py`
(BERT: a `jax.jit` of the model's stateless call, what `predict_on_batch`'s
step computes, outputs left on the device; `--dump-hlo` writes the program
it runs, after XLA's optimizations, in which the kernels are named).

    KERAS_BACKEND=jax python -m benchmarks.profile_jax_gpu --parts gpt,bert,train --dtype bfloat16
"""

import argparse
import collections
import glob
import gzip
import json
import sys
import tempfile
import time

from benchmarks.bert_benchmark import BERT_BASE
from benchmarks.bert_benchmark import TINY as BERT_TINY
from benchmarks.bert_benchmark import build_contender
from benchmarks.bert_benchmark import keras_data
from benchmarks.bert_benchmark import keras_dtype
from benchmarks.bert_benchmark import make_inputs
from benchmarks.gpt_generation_benchmark import GPT2_SMALL
from benchmarks.gpt_generation_benchmark import TINY as GPT_TINY
from benchmarks.gpt_generation_benchmark import build_keras_hub
from benchmarks.gpt_generation_benchmark import build_ours
from benchmarks.gpt_generation_benchmark import make_prompts
from benchmarks.gpt_generation_benchmark import OURS_WITHOUT
from benchmarks.gpt_generation_benchmark import without_optimisation


def gpu_kernels(trace):
    """`(name, duration µs)` of every kernel in a perfetto trace (the JSON
    of the Chrome trace format): complete events on the lines named
    "Stream …" of processes named "/device:GPU:…"."""
    process_names, thread_names = _line_names(trace)
    gpus = {pid for pid, name in process_names.items() if "GPU" in name}
    kernels = [
        (event["name"], float(event.get("dur", 0.0)))
        for event in trace["traceEvents"]
        if event.get("ph") == "X" and event.get("pid") in gpus
        and thread_names.get((event["pid"], event.get("tid")), "").startswith("Stream")
    ]
    if not kernels:  # say what the trace holds instead
        lines = sorted({name for (pid, _), name in thread_names.items() if pid in gpus})
        print(f"(no kernels found: processes {sorted(process_names.values())}; GPU lines {lines})")
    return kernels


def python_calls(trace):
    """`(name, duration µs)` of every Python call the profiler's Python
    tracer saw (the lines named "python…"), but the profiler's own and this
    script's: inclusive times, so a caller's includes its callees'."""
    process_names, thread_names = _line_names(trace)
    calls = [
        (event["name"], float(event.get("dur", 0.0)))
        for event in trace["traceEvents"]
        if event.get("ph") == "X" and thread_names.get((event.get("pid"), event.get("tid")), "").startswith("python")
        and not any(part in event["name"] for part in ("profiler.py", "contextlib.py", "profile_jax_gpu.py"))
    ]
    if not calls:  # say what the trace holds instead
        lines = sorted({f"{process_names.get(pid, pid)}: {name}" for (pid, _), name in thread_names.items()})
        print(f"(no Python calls found; the trace's lines: {lines[:20]})")
    return calls


def _line_names(trace):
    process_names, thread_names = {}, {}
    for event in trace["traceEvents"]:
        if event.get("ph") == "M" and event.get("name") == "process_name":
            process_names[event["pid"]] = event["args"]["name"]
        elif event.get("ph") == "M" and event.get("name") == "thread_name":
            thread_names[event["pid"], event["tid"]] = event["args"]["name"]
    return process_names, thread_names


def profile_call(call, steps, rows, python_rows=0):
    """One profiled call of `call` (which waits for its results): its
    numbers per step (µs of wall, process CPU and kernel time, kernels) and
    the top kernels by time (then, with `python_rows`, the top Python calls
    by inclusive time)."""
    import jax

    options = jax.profiler.ProfileOptions()
    options.python_tracer_level = 1 if python_rows else 0  # (the Python tracer slows the call it watches)
    with tempfile.TemporaryDirectory() as log_dir:
        with jax.profiler.trace(log_dir, create_perfetto_trace=True, profiler_options=options):
            start, cpu_start = time.perf_counter(), time.process_time()
            call()
            wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
        (path,) = glob.glob(f"{log_dir}/**/perfetto_trace.json.gz", recursive=True)
        with gzip.open(path) as file:
            trace = json.load(file)
    kernels = gpu_kernels(trace)
    numbers = {
        "wall_us": wall * 1e6 / steps,
        "cpu_us": cpu * 1e6 / steps,
        "kernel_us": sum(duration for _, duration in kernels) / steps,
        "kernels": len(kernels) / steps,
    }
    top = _largest(kernels, steps, rows)
    return numbers, top + (_largest(python_calls(trace), steps, python_rows) if python_rows else [])


def _largest(events, steps, rows):
    """`(µs per step, count per step, name)` of the `rows` names of
    `events` with the largest total time."""
    totals, counts = collections.Counter(), collections.Counter()
    for name, duration in events:
        totals[name] += duration
        counts[name] += 1
    return [(totals[name] / steps, counts[name] / steps, name[:100]) for name, _ in totals.most_common(rows)]


def report(title, numbers, top):
    busy = numbers["kernel_us"] / numbers["wall_us"] if numbers["wall_us"] else 0.0
    print(
        f"\n## {title}: wall {numbers['wall_us']:.0f} µs (process CPU {numbers['cpu_us']:.0f} µs)"
        f" | kernels {numbers['kernel_us']:.0f} µs ({busy:.0%} busy)"
        f" | {numbers['kernels']:.0f} kernels"
    )
    for device_us, count, kernel in top:
        print(f"{device_us:9.1f} µs {count:6.1f}x  {kernel}")
    sys.stdout.flush()


def profile_gpt(args):
    import jax
    import keras

    config = GPT_TINY if args.tiny else GPT2_SMALL
    print(f"\n# GPT greedy generate, prompt {args.prompt_len} + {args.new_tokens}, {args.dtype}; per new token")
    for name in args.gpt_contenders.split(","):
        keras.utils.set_random_seed(0)
        if name == "keras_hub":
            _, prepare, generate, _, _ = build_keras_hub(config, args.new_tokens, "auto", args.dtype)
        else:
            _, prepare, generate, _, _ = build_ours(config, args.new_tokens, args.dtype)
            if name in OURS_WITHOUT:
                generate = without_optimisation(name, generate)
        for batch_size in args.batch_sizes:
            inputs = prepare(make_prompts(batch_size, args.prompt_len, config["vocabulary_size"]))
            for _ in range(2):
                jax.block_until_ready(generate(inputs))
            numbers, top = profile_call(lambda: jax.block_until_ready(generate(inputs)), args.new_tokens, args.rows)
            report(f"{name}, batch {batch_size}", numbers, top)


def profile_bert(args):
    import keras

    config = BERT_TINY if args.tiny else BERT_BASE
    print(f"\n# BERT forward, batch {args.batch_size}, padded rows, {args.dtype}; per forward")
    for seq_len in args.seq_lens:
        inputs = make_inputs(args.batch_size, seq_len, config["vocabulary_size"], no_padding=False)
        for name in args.bert_contenders.split(","):
            keras.utils.set_random_seed(0)
            if name == "keras_hub":
                import keras_hub

                model = keras_hub.models.BertBackbone(**config, dtype=args.dtype)
            else:
                from attention_zoo_keras.models import BertBackbone

                model = BertBackbone(**config, dtype=args.dtype)
            forward, compiled = compiled_forward(model, inputs)
            for _ in range(3):
                forward()
            numbers, top = profile_call(forward, 1, args.rows)
            report(f"{name}, length {seq_len}", numbers, top)
            if args.dump_hlo:
                path = f"{args.dump_hlo}/bert_{name}_{seq_len}_{args.dtype}.hlo.txt"
                with open(path, "w") as file:
                    file.write(compiled.as_text())
                print(f"(its optimized HLO, where the kernels are named: {path})")


def profile_training(args):
    """`train_on_batch` as `bert_benchmark.py` times it (its own contenders,
    built by `build_contender`: the same models, optimizers and step), five
    steps profiled: whether the step waits on the host (kernel time far
    below wall time) or on the GPU."""
    import types

    import jax
    import keras

    config = BERT_TINY if args.tiny else BERT_BASE
    settings = types.SimpleNamespace(dtype=args.dtype, jit_compile="auto", outputs="device")
    print(f"\n# BERT train_on_batch, batch {args.batch_size}, padded rows, {keras_dtype(args.dtype, 'training')}; per step")
    for seq_len in args.seq_lens:
        inputs = make_inputs(args.batch_size, seq_len, config["vocabulary_size"], no_padding=False)
        for name in args.bert_contenders.split(","):
            keras.utils.set_random_seed(0)
            step, _, _, _ = build_contender(
                name, "training", settings, config, inputs, keras_data(inputs, config, "jax", None), None
            )
            for _ in range(3):
                step()
            steps = 5

            def train():
                for _ in range(steps):
                    logs = step()
                return jax.block_until_ready(logs)

            numbers, top = profile_call(train, steps, args.rows, python_rows=2 * args.rows)
            report(f"{name}, length {seq_len} (the kernels, then the Python calls)", numbers, top)


def compiled_forward(model, inputs):
    """`model`'s forward on `inputs` (numpy) compiled by XLA, a `jax.jit` of
    its stateless call (what `predict_on_batch`'s step computes): a call of
    it that waits for its outputs, and the compiled program."""
    import jax

    def forward(trainable, non_trainable, inputs):
        return model.stateless_call(trainable, non_trainable, inputs, training=False)[0]

    weights = ([v.value for v in model.trainable_variables], [v.value for v in model.non_trainable_variables])
    compiled = jax.jit(forward).lower(*weights, inputs).compile()
    return (lambda: jax.block_until_ready(compiled(*weights, inputs))), compiled


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default="gpt,bert", help="comma-separated subset of gpt,bert,train")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32], help="GPT batch sizes")
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--gpt-contenders", default="ours,ours_one_row_products,keras_hub")
    parser.add_argument("--batch-size", type=int, default=32, help="BERT batch size")
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[128, 512], help="BERT lengths (forward, training)")
    parser.add_argument("--bert-contenders", default="ours,keras_hub")
    parser.add_argument("--rows", type=int, default=10, help="kernels listed per call")
    parser.add_argument("--dump-hlo", metavar="DIR", help="also write each BERT forward's optimized HLO there")
    parser.add_argument("--tiny", action="store_true", help="2-layer, 64-wide models: a smoke test of the script")
    args = parser.parse_args()

    import jax

    print(f"# JAX GPU profile: {jax.devices()[0].device_kind}, jax {jax.__version__}")
    parts = {"gpt": profile_gpt, "bert": profile_bert, "train": profile_training}
    for part in args.parts.split(","):
        try:
            parts[part](args)
        except Exception as error:  # report and go on with the other parts
            print(f"\n## part {part} FAILED: {type(error).__name__}: {error}")


if __name__ == "__main__":
    main()
