"""Time and peak memory of one causal attention call against sequence length,
for softmax, linear, local and relative attention.

What is measured: one call of the mechanism function itself (no
projections, no layer) on float32 `(batch=1, L, heads=4, head_dim=64)`
query, key and value tensors, causal, for L = 512, 1024, …, 16384:

* ``softmax``: ``softmax_attention(q, k, v, is_causal=True)``, i.e.
  ``keras.ops.dot_product_attention`` with the causal mask (the backend's
  own attention op: ``jax.nn.dot_product_attention`` (XLA implementation),
  Keras' einsum/softmax XLA graph on TensorFlow,
  ``torch.nn.functional.scaled_dot_product_attention`` on torch).
* ``linear``: ``linear_attention(q, k, v, is_causal=True)``: elu+1 feature
  map, the causal form by chunks of 64 positions (the library defaults).
* ``local``: ``local_attention(q, k, v, is_causal=True, block_size=128,
  num_memory_blocks=1)``: each query block of 128 positions attends to
  itself (causally) and the previous block, at most 256 keys.
* ``relative``: ``relative_attention(q, k, v, is_causal=True,
  relative_key_embeddings=w)`` with one table ``w`` of ``2(L − 1) + 1``
  rows shared by the heads (max_distance = L − 1: Music Transformer's
  *unclipped* relative attention; no value table), which takes the skew path.

Modes: ``forward`` (the output) and ``forward_backward`` (the gradients of
``sum(output ⊙ G)``, G a fixed random tensor, with respect to q, k, v and,
for relative, the table).

How it runs: JAX ``jax.jit`` (compiled ahead of time with
``jax.jit(f).lower(...).compile()``); TensorFlow ``tf.function(jit_compile=True)``
(XLA); torch eager (forward under ``torch.no_grad()``, backward with
``torch.autograd.grad``). Each (mechanism, mode, L) runs in a fresh
subprocess (``--in-process`` to run them in this one): inputs are built,
the first call (compilation, warm-up) is timed separately, then one call
measures memory and ``--repeats`` calls are timed; the median is reported.

Memory: the peak memory *of one call*, above what the process holds just
before it (inputs and compiled program already resident). JAX and torch:
the peak resident set size — after the warm-up call, Python's garbage is
collected, glibc's free pages are returned (``malloc_trim(0)``), the
kernel's peak-RSS counter is reset (``/proc/self/clear_refs``, value 5),
then one call runs and ``VmHWM − VmRSS(before)`` from ``/proc/self/status``
is recorded: the memory the call really touches (temporaries and outputs).
TensorFlow keeps freed CPU memory in its allocator's pool, so its RSS
barely moves after the warm-up call; there the allocator's own peak during
the call is recorded (``tf.config.experimental.reset_memory_stats`` /
``get_memory_info("CPU:0")``; the RSS figure is kept in the JSON too). On
JAX the compiler's figure is recorded as well: ``memory_analysis()`` temp
+ output bytes of the compiled program. Small values (a few MiB) are
allocator noise, not a measurement.
Configurations whose memory would exceed ``--memory-limit-gib`` (16) are
skipped: on JAX from the compiler's figure before running; otherwise by
extrapolating the two previous lengths' measured peaks on a log-log line
(slope clamped to [1, 2]). Points predicted to take longer than
``--max-point-seconds`` are skipped likewise.

The scaling exponent of time and memory against L is the least-squares
slope on log-log axes, over all measured lengths and over the upper half of
them (short sequences are dominated by fixed per-call costs).

Example::

    KERAS_BACKEND=jax python -m benchmarks.attention_scaling_benchmark
    KERAS_BACKEND=jax python -m benchmarks.attention_scaling_benchmark --tiny   # seconds-long smoke run
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time
import traceback

# Shared helpers (stdlib-only at import time, so they run before numpy/Keras).
from benchmarks.plots import add_plot_arguments
from benchmarks.plots import check_plot_arguments
from benchmarks.plots import figure_rows
from benchmarks.plots import load_payloads
from benchmarks.plots import log_log_panels
from benchmarks.plots import save_figure
from benchmarks.sweep import add_worker_arguments
from benchmarks.sweep import extrapolate
from benchmarks.sweep import fit_exponent
from benchmarks.sweep import run_worker
from benchmarks.timing import call_memory
from benchmarks.timing import cpu_line
from benchmarks.timing import cpu_model
from benchmarks.timing import fmt_versions
from benchmarks.timing import limit_threads
from benchmarks.timing import load_average
from benchmarks.timing import load_line
from benchmarks.timing import start_backend
from benchmarks.timing import versions
from benchmarks.timing import write_json

MODULE = "benchmarks.attention_scaling_benchmark"  # what a point's worker process runs
MECHANISMS = ("softmax", "linear", "local", "relative")
MODES = ("forward", "forward_backward")
DEFAULT_LENGTHS = [512 * 2**i for i in range(6)]  # 512 … 16384
TINY_LENGTHS = [128, 256]
GIB = 1024**3
MIB = 1024**2
# Calls slower than this are timed min(--repeats, SLOW_CALL_REPEATS) times.
SLOW_CALL_SECONDS = 10.0
SLOW_CALL_REPEATS = 3


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=None, help="sequence lengths (default 512 … 16384)")
    parser.add_argument(
        "--mechanisms", default=",".join(MECHANISMS), help="comma-separated subset of " + ",".join(MECHANISMS)
    )
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of " + ",".join(MODES))
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per point (median reported)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed calls first (the first one compiles)")
    parser.add_argument("--num-heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--block-size", type=int, default=128, help="local attention's query block")
    parser.add_argument("--memory-blocks", type=int, default=1, help="local attention's num_memory_blocks")
    parser.add_argument(
        "--relative-max-distance", type=int, default=None,
        help="clip relative distances at this k (default: L − 1, i.e. unclipped Music Transformer)",
    )
    parser.add_argument("--memory-limit-gib", type=float, default=16.0, help="skip points needing more")
    parser.add_argument(
        "--max-point-seconds", type=float, default=300.0,
        help="skip points whose calls are predicted to take longer than this in all",
    )
    parser.add_argument("--point-timeout", type=float, default=900.0, help="kill a point's subprocess after this")
    parser.add_argument("--in-process", action="store_true", help="run every point in this process")
    parser.add_argument(
        "--threads", type=int, default=os.cpu_count(), help="intra-op threads (default: all cores)"
    )
    parser.add_argument("--backend-label", default=None, help="label of this run (default: the backend's name)")
    parser.add_argument("--tiny", action="store_true", help="seconds-long smoke run: L 128, 256, 1 repeat, in-process")
    parser.add_argument("--json", default=None, help="write the results to this JSON file")
    add_plot_arguments(parser, "time, memory")
    add_worker_arguments(parser)
    args = parser.parse_args(argv)
    if args.tiny:
        args.lengths = args.lengths or TINY_LENGTHS
        args.repeats = 1
        args.in_process = True
    args.lengths = sorted(args.lengths or DEFAULT_LENGTHS)
    args.mechanisms = [m.strip() for m in args.mechanisms.split(",") if m.strip()]
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = sorted(set(args.mechanisms) - set(MECHANISMS)) + sorted(set(args.modes) - set(MODES))
    if unknown:
        parser.error(f"unknown mechanisms or modes: {', '.join(unknown)}")
    check_plot_arguments(parser, args)
    return args


# --------------------------------------------------------------------------- one point


def mechanism_function(spec):
    """`(f(q, k, v, *extra), extra numpy arrays, description)` for the spec's
    mechanism at length `spec["length"]`."""
    import numpy as np

    from attention_zoo_keras.attention.linear import linear_attention
    from attention_zoo_keras.attention.local import local_attention
    from attention_zoo_keras.attention.relative import relative_attention
    from attention_zoo_keras.attention.softmax import softmax_attention

    name, length, head_dim = spec["mechanism"], spec["length"], spec["head_dim"]
    if name == "softmax":
        return (lambda q, k, v: softmax_attention(q, k, v, is_causal=True)), [], "softmax_attention(is_causal=True)"
    if name == "linear":
        return (lambda q, k, v: linear_attention(q, k, v, is_causal=True)), [], "linear_attention(is_causal=True)"
    if name == "local":
        block, memory = spec["block_size"], spec["memory_blocks"]

        def local(q, k, v):
            return local_attention(q, k, v, is_causal=True, block_size=block, num_memory_blocks=memory)

        return local, [], f"local_attention(is_causal=True, block_size={block}, num_memory_blocks={memory})"
    max_distance = spec["relative_max_distance"] or length - 1
    rng = np.random.default_rng(1)
    table = (rng.standard_normal((2 * max_distance + 1, head_dim)) * head_dim**-0.5).astype("float32")

    def relative(q, k, v, table):
        return relative_attention(q, k, v, is_causal=True, relative_key_embeddings=table)

    return relative, [table], f"relative_attention(is_causal=True), table ({2 * max_distance + 1}, {head_dim})"


def backend_call(backend, function, arrays, mode, limit_bytes):
    """Compiles `function` (or its gradient) for `arrays` on `backend`;
    `(call() -> None that runs it to completion, info dict)`. On JAX, info
    holds the compiler's memory figures and `skip` is set when they exceed
    `limit_bytes`."""
    import numpy as np

    cotangent = np.random.default_rng(2).standard_normal(arrays[0].shape).astype("float32")
    info = {}
    if backend == "jax":
        import jax
        import jax.numpy as jnp

        args = [jnp.asarray(a) for a in arrays]
        if mode == "forward":
            target = function
        else:
            args = [jnp.asarray(cotangent)] + args

            def target(g, *inputs):
                loss = lambda *x: jnp.sum(function(*x) * g)  # noqa: E731
                return jax.grad(loss, argnums=tuple(range(len(inputs))))(*inputs)

        start = time.perf_counter()
        compiled = jax.jit(target).lower(*args).compile()
        info["compile_s"] = time.perf_counter() - start
        stats = compiled.memory_analysis()
        if stats is not None:
            info["xla_memory"] = {
                "temp_bytes": int(stats.temp_size_in_bytes),
                "output_bytes": int(stats.output_size_in_bytes),
                "argument_bytes": int(stats.argument_size_in_bytes),
            }
            needed = stats.temp_size_in_bytes + stats.output_size_in_bytes + stats.argument_size_in_bytes
            if needed > limit_bytes:
                info["skip"] = f"would need {needed / GIB:.1f} GiB (XLA buffer assignment: temp + output + arguments)"

        def call():
            jax.block_until_ready(compiled(*args))

        return call, info
    if backend == "tensorflow":
        import tensorflow as tf

        args = [tf.constant(a) for a in arrays]
        if mode == "forward":
            compiled = tf.function(function, jit_compile=True)
        else:
            args = [tf.constant(cotangent)] + args

            def gradients(g, *inputs):
                with tf.GradientTape() as tape:
                    tape.watch(inputs)
                    loss = tf.reduce_sum(function(*inputs) * g)
                return tape.gradient(loss, inputs)

            compiled = tf.function(gradients, jit_compile=True)

        def call():
            compiled(*args)  # TF's eager executor is synchronous: outputs are computed on return

        return call, info
    if backend == "torch":
        import torch

        args = [torch.from_numpy(a) for a in arrays]
        if mode == "forward":

            def call():
                with torch.no_grad():
                    function(*args)

        else:
            g = torch.from_numpy(cotangent)
            leaves = [a.clone().requires_grad_(True) for a in args]

            def call():
                loss = (function(*leaves) * g).sum()
                torch.autograd.grad(loss, leaves)

        return call, info
    raise ValueError(f"unsupported backend {backend}")


def measure_memory(backend, call):
    """Runs `call` once and measures its peak memory: `{"peak_bytes",
    "peak_rss_bytes", "memory_method"}` (`timing.call_memory`: the resident
    set size on JAX and torch, TensorFlow's CPU allocator's peak there)."""
    measured = call_memory(backend, call)
    return {key: measured[key] for key in ("peak_rss_bytes", "memory_method", "peak_bytes")}


def run_point(spec):
    """Measures one (mechanism, mode, length): a result dict with `status`
    ok / skipped / failed. Expects Keras to be importable with the backend
    already chosen; imports it."""
    import keras
    import numpy as np

    backend = keras.backend.backend()
    result = {"status": "ok", "backend": backend}
    try:
        rng = np.random.default_rng(0)
        shape = (1, spec["length"], spec["num_heads"], spec["head_dim"])
        qkv = [rng.standard_normal(shape).astype("float32") for _ in range(3)]
        function, extra, description = mechanism_function(spec)
        result["call"] = description
        limit = spec["memory_limit_gib"] * GIB
        call, info = backend_call(backend, function, qkv + extra, spec["mode"], limit)
        result.update(info)
        if "skip" in result:
            result["status"] = "skipped"
            result["reason"] = result.pop("skip")
            return result
        start = time.perf_counter()
        call()
        result["first_call_s"] = time.perf_counter() - start
        for _ in range(spec["warmup"] - 1):
            call()
        result.update(measure_memory(backend, call))
        repeats = spec["repeats"]
        if result["first_call_s"] - result.get("compile_s", 0.0) > SLOW_CALL_SECONDS:
            repeats = min(repeats, SLOW_CALL_REPEATS)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
        result.update(times_s=times, median_s=statistics.median(times), min_s=min(times))
    except Exception as error:  # reported by the parent; the other points go on
        result.update(status="failed", reason=f"{type(error).__name__}: {error}", traceback=traceback.format_exc())
    return result


def worker_main(args):
    """`--worker SPEC`: one point in this (fresh) process; the result as JSON
    to `--worker-output`."""
    start_backend(args.threads)
    result = run_point(json.loads(args.worker))
    with open(args.worker_output, "w") as f:
        json.dump(result, f)
    return 0


def run_in_subprocess(spec, args):
    """Runs one point in a fresh Python process; its result dict."""
    run = run_worker(MODULE, spec, args.threads, args.point_timeout, tail_chars=2000)
    if run["timed_out"]:
        return {"status": "failed", "reason": f"timed out after {args.point_timeout:.0f} s"}
    if run["returncode"] != 0 or run["result"] is None:
        return {"status": "failed", "reason": f"worker exited {run['returncode']}", "output_tail": run["tail"]}
    return run["result"]


# --------------------------------------------------------------------------- fits


def upper_half(points):
    """The longer half of the measured points (at least two, if there are)."""
    points = sorted(points)
    return points[len(points) // 2 :] if len(points) >= 4 else points[-2:]


def exponents(results, mechanism, mode):
    """Fitted exponents of time and memory: {"time_all", "time_upper", "memory_all", "memory_upper"}."""
    measured = [r for r in results if r["mechanism"] == mechanism and r["mode"] == mode and r["status"] == "ok"]
    times = [(r["length"], r["median_s"]) for r in measured]
    memory = [(r["length"], r["peak_bytes"]) for r in measured]
    return {
        "time_all": fit_exponent(times),
        "time_upper": fit_exponent(upper_half(times)),
        "memory_all": fit_exponent(memory),
        "memory_upper": fit_exponent(upper_half(memory)),
    }


# --------------------------------------------------------------------------- plot


def plot(payloads, path):
    """Log-log time and memory against L, one row per run (backend),
    a colour per mechanism, solid forward and dashed forward+backward."""
    colours = {"softmax": "tab:blue", "linear": "tab:green", "local": "tab:orange", "relative": "tab:red"}
    styles = {"forward": ("-", "o"), "forward_backward": ("--", "s")}
    plt, figure, axes = figure_rows(len(payloads))
    for row, payload in zip(axes, payloads):
        results = payload["results"]
        for mechanism in payload["mechanisms"]:
            for mode in payload["modes"]:
                measured = sorted(
                    (r["length"], r["median_s"], r["peak_bytes"])
                    for r in results
                    if r["mechanism"] == mechanism and r["mode"] == mode and r["status"] == "ok"
                )
                if not measured:
                    continue
                lengths = [m[0] for m in measured]
                line, marker = styles[mode]
                label = f"{mechanism} {mode.replace('_', '+')}"
                kwargs = dict(color=colours[mechanism], linestyle=line, marker=marker, label=label)
                row[0].plot(lengths, [m[1] * 1e3 for m in measured], **kwargs)
                row[1].plot(lengths, [max(m[2], 1) / MIB for m in measured], **kwargs)
        title = f"{payload['label']}: 1 × L × {payload['num_heads']} heads × {payload['head_dim']}, causal, float32"
        log_log_panels(row, ("time per call (ms, median)", "peak memory of one call (MiB)"), "sequence length L", title)
        row[0].legend(fontsize=7, ncol=2)
    save_figure(plt, figure, path)


# --------------------------------------------------------------------------- main


def describe(result):
    """One line about a point's outcome."""
    if result["status"] != "ok":
        return f"{result['status']}: {result.get('reason', '')}"
    line = (
        f"median {result['median_s'] * 1e3:.1f} ms over {len(result['times_s'])} "
        f"(all: {', '.join(f'{t * 1e3:.1f}' for t in result['times_s'])}); "
        f"peak +{result['peak_bytes'] / MIB:.1f} MiB"
    )
    if "xla_memory" in result:
        xla = result["xla_memory"]
        line += f" (XLA temp+output {(xla['temp_bytes'] + xla['output_bytes']) / MIB:.1f} MiB)"
    line += f"; first call {result['first_call_s']:.2f} s"
    if "compile_s" in result:
        line += f" after {result['compile_s']:.2f} s compiling"
    return line


def print_tables(payload):
    """The results table and the fitted exponents, as Markdown."""
    results, modes = payload["results"], payload["modes"]
    xla = any("xla_memory" in r for r in results)
    print(f"\n## {payload['label']}: time (ms, median) and peak memory of one call (MiB)\n")
    header = ["mechanism", "L"]
    for mode in modes:
        name = mode.replace("_", "+")
        header += [f"{name} ms", f"{name} MiB"] + ([f"{name} XLA MiB"] if xla else [])
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for mechanism in payload["mechanisms"]:
        for length in payload["lengths"]:
            cells = [mechanism, str(length)]
            for mode in modes:
                found = [r for r in results if (r["mechanism"], r["mode"], r["length"]) == (mechanism, mode, length)]
                r = found[0] if found else {"status": "not run"}
                if r["status"] == "ok":
                    cells += [f"{r['median_s'] * 1e3:.1f}", f"{r['peak_bytes'] / MIB:.1f}"]
                else:
                    cells += [r["status"], "-"]
                if xla:
                    memory = r.get("xla_memory")
                    cells.append(f"{(memory['temp_bytes'] + memory['output_bytes']) / MIB:.1f}" if memory else "-")
            print("| " + " | ".join(cells) + " |")
    print(
        "\nMiB = peak memory of one call above the process's use before it (resident set size; TensorFlow:"
        "\nits CPU allocator's peak); XLA MiB = the compiled program's temp + output buffers (memory_analysis)."
    )
    print(f"\n## {payload['label']}: fitted exponents (time ∝ L^a, memory ∝ L^b; least squares on log-log)\n")
    print("| mechanism | mode | time a (all L) | time a (upper half) | memory b (all L) | memory b (upper half) |")
    print("|---|---|---|---|---|---|")
    for mechanism in payload["mechanisms"]:
        for mode in modes:
            fits = payload["exponents"][mechanism][mode]
            cells = ["-" if fits[k] is None else f"{fits[k]:.2f}" for k in ("time_all", "time_upper", "memory_all", "memory_upper")]
            print(f"| {mechanism} | {mode.replace('_', '+')} | " + " | ".join(cells) + " |")


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        return worker_main(args)
    if args.replot:
        plot(load_payloads(args.replot), args.plot)
        print(f"plot: {args.plot}")
        return 0

    limit_threads(args.threads)
    load_start = load_average()
    spec_base = {
        "num_heads": args.num_heads,
        "head_dim": args.head_dim,
        "block_size": args.block_size,
        "memory_blocks": args.memory_blocks,
        "relative_max_distance": args.relative_max_distance,
        "memory_limit_gib": args.memory_limit_gib,
        "warmup": max(1, args.warmup),
        "repeats": args.repeats,
    }
    if args.in_process:
        backend, _ = start_backend(args.threads)
    else:
        backend = os.environ.get("KERAS_BACKEND", "(Keras default)")
    label = args.backend_label or backend
    print(f"# attention scaling benchmark, backend={label}")
    print(cpu_line(args.threads))
    print(
        f"shapes: batch 1 x L x {args.num_heads} heads x {args.head_dim}, float32, causal; lengths "
        f"{', '.join(map(str, args.lengths))}; warmup {spec_base['warmup']}, repeats {args.repeats} (median); "
        f"{'in this process' if args.in_process else 'a fresh process per point'}; memory limit "
        f"{args.memory_limit_gib:g} GiB"
    )
    print(load_line("start", load_start))
    sys.stdout.flush()

    results = []
    started = time.perf_counter()
    for mechanism in args.mechanisms:
        for mode in args.modes:
            for length in args.lengths:
                spec = dict(spec_base, mechanism=mechanism, mode=mode, length=length)
                done = [r for r in results if r["mechanism"] == mechanism and r["mode"] == mode and r["status"] == "ok"]
                predicted_memory = extrapolate([(r["length"], r["peak_bytes"]) for r in done], length)
                predicted_time = extrapolate([(r["length"], r["median_s"]) for r in done], length)
                calls = spec["warmup"] + 1 + args.repeats
                if predicted_memory is not None and predicted_memory > args.memory_limit_gib * GIB:
                    result = {
                        "status": "skipped",
                        "reason": f"would need {predicted_memory / GIB:.1f} GiB (extrapolated from the measured peaks)",
                    }
                elif predicted_time is not None and predicted_time * calls > args.max_point_seconds:
                    result = {
                        "status": "skipped",
                        "reason": f"would take ~{predicted_time * calls:.0f} s for {calls} calls "
                        f"(extrapolated; limit --max-point-seconds {args.max_point_seconds:g})",
                    }
                else:
                    result = run_point(spec) if args.in_process else run_in_subprocess(spec, args)
                result.update(mechanism=mechanism, mode=mode, length=length)
                results.append(result)
                print(f"[{mechanism} {mode} L={length}] {describe(result)}")
                if result["status"] == "failed" and ("traceback" in result or "output_tail" in result):
                    print(result.get("traceback") or result.get("output_tail"))
                sys.stdout.flush()
                backend = result.get("backend", backend)

    payload = {
        "backend": backend,
        "label": args.backend_label or backend,
        "cpu": cpu_model(),
        "logical_cores": os.cpu_count(),
        "threads": args.threads,
        "python": platform.python_version(),
        "versions": versions(backend, extra=("matplotlib",)),
        "num_heads": args.num_heads,
        "head_dim": args.head_dim,
        "block_size": args.block_size,
        "memory_blocks": args.memory_blocks,
        "relative_max_distance": args.relative_max_distance or "L - 1 (unclipped)",
        "lengths": args.lengths,
        "mechanisms": args.mechanisms,
        "modes": args.modes,
        "warmup": spec_base["warmup"],
        "repeats": args.repeats,
        "in_process": args.in_process,
        "memory_limit_gib": args.memory_limit_gib,
        "load_average_start": load_start,
        "load_average_end": load_average(),
        "elapsed_s": time.perf_counter() - started,
        "results": results,
        "exponents": {m: {mode: exponents(results, m, mode) for mode in args.modes} for m in args.mechanisms},
    }
    print_tables(payload)
    print("\nversions: " + fmt_versions(payload["versions"]))
    print(load_line("end", payload["load_average_end"]))
    print(f"elapsed: {payload['elapsed_s']:.0f} s")
    write_json(args.json, payload)
    if args.plot:
        plot([payload], args.plot)
        print(f"plot: {args.plot}")
    return 1 if any(r["status"] == "failed" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
