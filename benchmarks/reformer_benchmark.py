"""Reformer language model at 4K … 64K tokens: LSH attention against full
softmax attention in the same model — time and peak memory of a forward
pass and of a training step — and a 64K-token forward of an
enwik8-shaped Reformer.

The Keras backend is the one KERAS_BACKEND names; run the script once per
backend (``bash benchmarks/run.sh reformer`` runs JAX, torch, TensorFlow).
Weights are random: nothing is downloaded.

**Sweep model** (a small enwik8-like Reformer, so that full attention fits
as far as it can): ``ReformerCausalLM`` on a ``ReformerBackbone(
vocabulary_size=258, hidden_dim=256, num_heads=4, head_dim=64,
intermediate_dim=1024, attention=m, num_layers=2,
attention_options={"lsh": {"num_hashes": 2, "chunk_length": 64,
"num_chunks_before": 1, "seed": 0}}, axial_pos_shape=(n₁, n₂),
axial_pos_embds_dim=(64, 192), dropout=0, recompute=True)`` with m =
``"lsh"`` or ``"softmax"`` (every layer the same;
full attention has its own query and key projections, LSH shares one, so
the softmax model has 2 × 256² more weights). Per length L:
``axial_pos_shape`` factors L (n₁ = 2^⌊log₂L / 2⌋, n₂ = L / n₁: training
needs exactly n₁·n₂ tokens) and ``num_buckets`` is what transformers'
``ReformerConfig`` picks when it is unset (``_set_num_buckets``): 2^⌊log₂(2L
/ chunk)⌋, factorised into [2^⌊p/2⌋, 2^⌈p/2⌉] above 2·max(√(L / chunk),
chunk) (with ``max_position_embeddings = L``): 128 at 4K, [16, 16] at 8K,
[16, 32] at 16K, [32, 32] at 32K, [32, 64] at 64K. Batch 1, float32, random
token ids, a padding mask of ones.

**Modes.**

* ``forward``: inference logits ``lm({"token_ids", "padding_mask"},
  training=False)`` — JAX: ``jax.jit`` of a stateless call, compiled ahead of
  time (``lower().compile()``); TensorFlow: ``tf.function(jit_compile=True)``;
  torch: eager under ``torch.no_grad()`` (``backend_support.compile_inference``
  on TF and torch).
* ``train``: one training step, i.e. sparse categorical cross-entropy of the
  logits against random next tokens, its gradients (through the reversible
  stack's recomputing backward pass) and an Adam update — JAX: a jitted
  stateless step (``stateless_call`` under ``jax.value_and_grad``, then
  ``optimizer.stateless_apply``; the state is donated), compiled ahead of
  time; TensorFlow: ``model.train_on_batch`` after ``compile(jit_compile=True)``
  (XLA); torch: ``model.train_on_batch`` (eager).

Each (mechanism, length) runs in a fresh subprocess (forward, then train),
so that a point that runs out of memory kills only its own process.
Timing: JAX runs its ahead-of-time compiled program, so the first call is a
sample; TensorFlow's first call traces and compiles, so it is a warm-up;
torch's first call is a warm-up unless it took longer than
``--slow-call-seconds`` (eager: nothing to compile). Then calls are timed
up to ``--repeats`` samples in all (median), but only one when a call takes
longer than ``--slow-call-seconds``.

**Memory.**

* *call peak*: the peak memory of one call above what the process held just
  before it (weights, inputs, compiled program already resident). JAX and
  torch: resident set size — Python's garbage collected, glibc's free pages
  returned (``malloc_trim``), the kernel's peak counter reset
  (``/proc/self/clear_refs``), the call, then ``VmHWM − VmRSS(before)``
  (``timing.reset_peak_rss`` / ``peak_rss``). TensorFlow keeps freed memory
  in its allocator's pool, so its RSS barely moves after the first call;
  there it is the allocator's peak during the call
  (``tf.config.experimental.get_memory_info("CPU:0")``; the RSS figure is
  in the JSON too). On JAX the compiled program's ``memory_analysis()``
  (temp + output bytes) is recorded too.
* *idle*: the resident size of the process with the model built and the
  inputs made, before any call (imports, weights, optimizer state).
* *process peak*: the highest resident size of the whole subprocess
  (compilation included): what the machine must hold.

**Out of memory / over budget.** A watchdog thread in each subprocess ends
it (and records "out of memory") when its resident size exceeds
``--memory-limit-gib`` or the machine's available memory drops below
``--min-available-gib`` — before the kernel's OOM killer would pick a
process, perhaps someone else's. On JAX a program whose XLA buffer
assignment (temp + output) plus the process's resident size exceeds the
limit is not run ("out of memory: XLA … needs …"). On the other backends a
point whose idle size plus call peak, the latter extrapolated from the two
previous lengths on a log-log line (slope clamped to [1, 2]), would exceed
the limit is not run either. A call predicted (likewise, from its time) to
take longer than ``--max-call-seconds`` is not run ("over budget"; on JAX
checked after XLA's memory figure), and a subprocess that runs longer than
``--point-timeout`` is killed ("over budget"). Once a (mechanism, mode)
stops, longer lengths are not tried.

**enwik8-shaped forward** (``--parts enwik8``): transformers'
``google/reformer-enwik8`` configuration with random weights —
``ReformerBackbone(vocabulary_size=258, hidden_dim=1024, num_heads=8,
head_dim=128, intermediate_dim=4096, attention="lsh", num_layers=12,
attention_options={"lsh": {"num_hashes": 4, "num_buckets": 512,
"chunk_length": 256}}, axial_pos_shape=(128, 512), axial_pos_embds_dim=(256,
768), feed_forward_chunk_size=4096,
dropout=0)`` (the feed-forward runs 4096 positions at a time, so the 65536 ×
4096 activation never exists whole) — one forward over 65536 tokens,
compiled ahead of time, timed once, with its call peak, process peak and
XLA's figure, in a subprocess killed after ``--enwik8-timeout`` seconds
(1200; it takes about 9 minutes on 2 cores). If it runs out of memory
(``--memory-limit-gib``, ``--min-available-gib``), the length is halved
until it fits, and the result says so.

``--combine RUN.json …`` reprints the tables of one backend's runs (each
mechanism from the last file that measured it) and ``--replot`` draws
several backends' runs into one figure, without running anything.

Example::

    KERAS_BACKEND=jax python -m benchmarks.reformer_benchmark --parts sweep,enwik8
    KERAS_BACKEND=torch python -m benchmarks.reformer_benchmark --lengths 4096 8192 --mechanisms lsh,softmax
    KERAS_BACKEND=jax python -m benchmarks.reformer_benchmark --tiny   # seconds-long smoke run
"""

import argparse
import copy
import gc
import json
import os
import platform
import statistics
import sys
import threading
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
from benchmarks.timing import peak_rss
from benchmarks.timing import start_backend
from benchmarks.timing import versions
from benchmarks.timing import write_json

MODULE = "benchmarks.reformer_benchmark"  # what a point's worker process runs
MECHANISMS = ("lsh", "softmax")
MODES = ("forward", "train")
PARTS = ("sweep", "enwik8")
DEFAULT_LENGTHS = [4096 * 2**i for i in range(5)]  # 4096 … 65536
GIB = 1024**3
MIB = 1024**2

SWEEP_MODEL = dict(
    vocabulary_size=258, hidden_dim=256, num_heads=4, head_dim=64, intermediate_dim=1024, num_layers=2,
    attention_options={"lsh": {"num_hashes": 2, "chunk_length": 64}}, axial_pos_embds_dim=(64, 192),
    feed_forward_chunk_size=None,
)
# transformers' google/reformer-enwik8 (config.json), random weights.
ENWIK8_MODEL = dict(
    vocabulary_size=258, hidden_dim=1024, num_heads=8, head_dim=128, intermediate_dim=4096, num_layers=12,
    attention_options={"lsh": {"num_hashes": 4, "num_buckets": 512, "chunk_length": 256}},
    axial_pos_shape=(128, 512), axial_pos_embds_dim=(256, 768), feed_forward_chunk_size=4096,
)
ENWIK8_LENGTH = 65536
# --tiny: a seconds-long smoke run of the script itself, not a benchmark.
TINY_SWEEP_MODEL = dict(SWEEP_MODEL, hidden_dim=64, num_heads=2, head_dim=16, intermediate_dim=128,
                        attention_options={"lsh": {"num_hashes": 2, "chunk_length": 16}}, axial_pos_embds_dim=(16, 48))
TINY_ENWIK8_MODEL = dict(ENWIK8_MODEL, hidden_dim=64, num_heads=2, head_dim=16, intermediate_dim=128, num_layers=2,
                         attention_options={"lsh": {"num_hashes": 4, "num_buckets": 16, "chunk_length": 32}},
                         axial_pos_shape=(16, 32), axial_pos_embds_dim=(16, 48), feed_forward_chunk_size=128)
TINY_LENGTHS = [256, 512]
TINY_ENWIK8_LENGTH = 512


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default="sweep", help="comma-separated subset of " + ",".join(PARTS))
    parser.add_argument("--lengths", type=int, nargs="+", default=None, help="sweep lengths (default 4096 … 65536)")
    parser.add_argument(
        "--mechanisms", default=",".join(MECHANISMS), help="attention of every layer: comma-separated subset of "
        + ",".join(MECHANISMS)
    )
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of " + ",".join(MODES))
    parser.add_argument("--repeats", type=int, default=3, help="timed samples per point (median; default 3)")
    parser.add_argument(
        "--slow-call-seconds", type=float, default=8.0,
        help="a call slower than this is timed once (and on torch the first call is then a sample; default 8)",
    )
    parser.add_argument("--num-layers", type=int, default=None, help="sweep model layers (default 2)")
    parser.add_argument("--num-heads", type=int, default=None, help="sweep model heads (default 4)")
    parser.add_argument("--num-hashes", type=int, default=None, help="sweep model LSH rounds (default 2)")
    parser.add_argument("--enwik8-length", type=int, default=None, help="enwik8-shaped forward length (65536)")
    parser.add_argument("--enwik8-layers", type=int, default=None, help="enwik8-shaped model layers (12)")
    parser.add_argument(
        "--memory-limit-gib", type=float, default=19.0,
        help="a subprocess resident above this is ended and recorded 'out of memory' (default 19)",
    )
    parser.add_argument(
        "--min-available-gib", type=float, default=1.0,
        help="also end it when the machine's MemAvailable drops below this (default 1)",
    )
    parser.add_argument(
        "--max-call-seconds", type=float, default=240.0,
        help="do not run a call predicted to take longer ('over budget'; default 240)",
    )
    parser.add_argument(
        "--point-timeout", type=float, default=900.0,
        help="kill a (mechanism, length) subprocess after this many seconds ('over budget'; default 900)",
    )
    parser.add_argument(
        "--enwik8-timeout", type=float, default=1200.0,
        help="kill the enwik8-shaped forward's subprocess after this many seconds (default 1200)",
    )
    parser.add_argument("--in-process", action="store_true", help="run every point in this process (no OOM guard)")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="intra-op threads (default: all cores)")
    parser.add_argument("--backend-label", default=None, help="label of this run (default: the backend's name)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights and tokens")
    parser.add_argument("--tiny", action="store_true", help="seconds-long smoke run of the script")
    parser.add_argument("--json", default=None, help="write the results to this JSON file")
    add_plot_arguments(parser, "time, memory")
    parser.add_argument(
        "--combine", nargs="+", default=None, metavar="JSON",
        help="only combine runs of one backend: each mechanism's rows from the last of these JSON files that "
        "measured it (the enwik8 result from the last that has one); prints the tables, writes --json/--plot",
    )
    add_worker_arguments(parser)
    args = parser.parse_args(argv)
    args.parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    args.mechanisms = [m.strip() for m in args.mechanisms.split(",") if m.strip()]
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = sorted(set(args.parts) - set(PARTS)) + sorted(set(args.mechanisms) - set(MECHANISMS))
    unknown += sorted(set(args.modes) - set(MODES))
    if unknown:
        parser.error(f"unknown parts, mechanisms or modes: {', '.join(unknown)}")
    check_plot_arguments(parser, args)
    args.sweep_model = copy.deepcopy(TINY_SWEEP_MODEL if args.tiny else SWEEP_MODEL)
    args.enwik8_model = copy.deepcopy(TINY_ENWIK8_MODEL if args.tiny else ENWIK8_MODEL)
    for key, value in (("num_layers", args.num_layers), ("num_heads", args.num_heads)):
        if value is not None:
            args.sweep_model[key] = value
    if args.num_hashes is not None:
        args.sweep_model["attention_options"]["lsh"]["num_hashes"] = args.num_hashes
    if args.enwik8_layers is not None:
        args.enwik8_model["num_layers"] = args.enwik8_layers
    args.enwik8_length = args.enwik8_length or (TINY_ENWIK8_LENGTH if args.tiny else ENWIK8_LENGTH)
    args.lengths = sorted(args.lengths or (TINY_LENGTHS if args.tiny else DEFAULT_LENGTHS))
    if args.tiny:
        args.repeats = min(args.repeats, 2)
    return args


# --------------------------------------------------------------------------- model shapes


def axial_shape(length):
    """`(n₁, n₂)`, n₁·n₂ = length, n₁ = 2^⌊log₂(length) / 2⌋ (length a power of two)."""
    rows = 2 ** ((length.bit_length() - 1) // 2)
    if length % rows:
        raise ValueError(f"the sweep needs lengths that are powers of two; got {length}")
    return rows, length // rows


def transformers_num_buckets(length, chunk_length, max_position_embeddings):
    """`num_buckets` as transformers' `LSHSelfAttention._set_num_buckets` picks it
    when the config leaves it unset: 2^p with p = ⌊log₂(2·length / chunk)⌋,
    factorised into [2^⌊p/2⌋, 2^(p − ⌊p/2⌋)] when above
    2·max(⌊√(max_position_embeddings / chunk)⌋, chunk).

    >>> [transformers_num_buckets(n, 64, n) for n in (4096, 8192, 65536)]
    [128, [16, 16], [32, 64]]
    """
    power = (2 * (length // chunk_length)).bit_length() - 1
    buckets = 2**power
    limit = 2 * max(int((max_position_embeddings // chunk_length) ** 0.5), chunk_length)
    if buckets > limit:
        return [2 ** (power // 2), 2 ** (power - power // 2)]
    return buckets


def model_config(model, mechanism, length):
    """`ReformerBackbone` keyword arguments for `model` (SWEEP_MODEL-like)
    with every layer's attention `mechanism`, at sequence `length`."""
    config = copy.deepcopy(model)
    if "axial_pos_shape" not in config:
        config["axial_pos_shape"] = axial_shape(length)
    lsh = config["attention_options"]["lsh"]
    if "num_buckets" not in lsh:
        positions = config["axial_pos_shape"][0] * config["axial_pos_shape"][1]
        lsh["num_buckets"] = transformers_num_buckets(length, lsh["chunk_length"], positions)
    lsh["seed"] = 0
    config.update(attention=mechanism, is_causal=True, dropout=0.0, attention_dropout=0.0, recompute=True, seed=0)
    config["axial_pos_shape"] = tuple(config["axial_pos_shape"])
    config["axial_pos_embds_dim"] = tuple(config["axial_pos_embds_dim"])
    return config


def build_lm(config, seed):
    import keras

    from attention_zoo_keras.models.reformer.reformer_backbone import ReformerBackbone
    from attention_zoo_keras.models.reformer.reformer_causal_lm import ReformerCausalLM

    keras.utils.set_random_seed(seed)
    return ReformerCausalLM(backbone=ReformerBackbone(**config))


# --------------------------------------------------------------------------- memory guard


def _status_kib(path, field):
    with open(path) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return None


class MemoryGuard:
    """A daemon thread that ends this process with exit code 3 once its
    resident size exceeds `limit_bytes` or the machine's MemAvailable drops
    below `floor_bytes`, calling `on_trip(reason)` first (to record it)."""

    EXIT_CODE = 3

    def __init__(self, limit_bytes, floor_bytes, on_trip, interval=0.02):
        self.limit, self.floor, self.on_trip, self.interval = limit_bytes, floor_bytes, on_trip, interval
        self.highest = 0
        thread = threading.Thread(target=self._watch, daemon=True)
        thread.start()

    def _watch(self):
        while True:
            rss = (_status_kib("/proc/self/status", "VmRSS") or 0) * 1024
            available = (_status_kib("/proc/meminfo", "MemAvailable") or 1 << 40) * 1024
            self.highest = max(self.highest, rss)
            reason = None
            if rss > self.limit:
                reason = f"resident size {rss / GIB:.1f} GiB exceeded the limit {self.limit / GIB:.1f} GiB"
            elif available < self.floor:
                reason = (f"machine's available memory fell to {available / GIB:.1f} GiB (< {self.floor / GIB:.1f}) "
                          f"at a resident size of {rss / GIB:.1f} GiB")
            if reason is not None:
                try:
                    self.on_trip(reason)
                finally:
                    os._exit(self.EXIT_CODE)
            time.sleep(self.interval)


# --------------------------------------------------------------------------- one point (in the worker)


def _to_device(backend, array):
    import keras

    if backend == "jax":
        import jax.numpy as jnp

        return jnp.asarray(array)
    return keras.ops.convert_to_tensor(array)


def forward_function(backend, lm, ids, mask):
    """`(call() -> None running one forward to completion, info)`."""
    import keras

    info = {}
    if backend == "jax":
        import jax

        variables = lm.variables

        def stateless(values, token_ids, padding_mask):
            with keras.StatelessScope(state_mapping=list(zip(variables, values))):
                return lm({"token_ids": token_ids, "padding_mask": padding_mask}, training=False)

        values = [v.value for v in variables]
        ids, mask = _to_device(backend, ids), _to_device(backend, mask)
        start = time.perf_counter()
        compiled = jax.jit(stateless).lower(values, ids, mask).compile()
        info["compile_s"] = time.perf_counter() - start
        info["xla_memory"] = _xla_memory(compiled)

        def call():
            jax.block_until_ready(compiled(values, ids, mask))

        return call, info
    from attention_zoo_keras.backend_support import compile_inference

    function = compile_inference(
        lambda token_ids, padding_mask: lm({"token_ids": token_ids, "padding_mask": padding_mask}, training=False),
        lm.variables,
    )
    ids, mask = _to_device(backend, ids), _to_device(backend, mask)

    def call():
        function(ids, mask)  # TF and torch on CPU: computed on return

    return call, info


def train_function(backend, lm, ids, mask, labels):
    """`(call() -> None running one training step, info)`: cross-entropy,
    gradients, Adam update."""
    import keras

    info = {}
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    optimizer = keras.optimizers.Adam(1e-4)
    x = {"token_ids": ids, "padding_mask": mask}
    if backend == "jax":
        import jax

        optimizer.build(lm.trainable_variables)

        def compute_loss(trainable, non_trainable, x, y):
            logits, non_trainable = lm.stateless_call(trainable, non_trainable, x, training=True)
            return loss(y, logits), non_trainable

        grad_fn = jax.value_and_grad(compute_loss, has_aux=True)

        def step(state, x, y):
            trainable, non_trainable, optimizer_variables = state
            (value, non_trainable), grads = grad_fn(trainable, non_trainable, x, y)
            trainable, optimizer_variables = optimizer.stateless_apply(optimizer_variables, grads, trainable)
            return value, [trainable, non_trainable, optimizer_variables]

        state = [
            [v.value for v in lm.trainable_variables],
            [v.value for v in lm.non_trainable_variables],
            [v.value for v in optimizer.variables],
        ]
        x = {k: _to_device(backend, v) for k, v in x.items()}
        y = _to_device(backend, labels)
        start = time.perf_counter()
        compiled = jax.jit(step, donate_argnums=0).lower(state, x, y).compile()
        info["compile_s"] = time.perf_counter() - start
        info["xla_memory"] = _xla_memory(compiled)
        holder = {"state": state}

        def call():
            value, holder["state"] = compiled(holder["state"], x, y)
            jax.block_until_ready((value, holder["state"]))
            info["loss"] = float(value)

        return call, info
    lm.compile(optimizer=optimizer, loss=loss, metrics=None, weighted_metrics=None,
               jit_compile=backend == "tensorflow")

    def call():
        info["loss"] = float(lm.train_on_batch(x, labels))

    return call, info


def _xla_memory(compiled):
    stats = compiled.memory_analysis()
    if stats is None:
        return None
    return {
        "temp_bytes": int(stats.temp_size_in_bytes),
        "output_bytes": int(stats.output_size_in_bytes),
        "argument_bytes": int(stats.argument_size_in_bytes),
        "alias_bytes": int(stats.alias_size_in_bytes),
    }


def measured_call(backend, call):
    """One call: `{"seconds", "peak_bytes", "peak_rss_bytes", "memory_method",
    "rss_before_bytes"}` (`timing.call_memory`; see the module docstring);
    also returns the process's VmHWM before the counter was reset (so the
    process peak is not lost)."""
    hwm_before = peak_rss()
    return call_memory(backend, call), hwm_before


def run_mode(backend, make_call, repeats, slow, limit_bytes, record, process, predicted_s=None, budget_s=None):
    """Compiles, checks XLA's figure against the limit (then, on JAX, the
    parent's predicted call time against the budget), warms up and times;
    fills `record` (a dict) as it goes."""
    start = time.perf_counter()
    call, info = make_call()
    record.update(info)
    record["setup_s"] = time.perf_counter() - start
    xla = info.get("xla_memory")
    if xla is not None:
        needed = xla["temp_bytes"] + xla["output_bytes"] + _status_kib("/proc/self/status", "VmRSS") * 1024
        if needed > limit_bytes:
            record.update(status="out of memory", reason=(
                f"not run: XLA buffer assignment needs {(xla['temp_bytes'] + xla['output_bytes']) / GIB:.1f} GiB "
                f"(temp + output) on top of the process's {needed / GIB - (xla['temp_bytes'] + xla['output_bytes']) / GIB:.1f} GiB, "
                f"> limit {limit_bytes / GIB:.1f} GiB"))
            return
    if predicted_s is not None and budget_s is not None and predicted_s > budget_s:
        record.update(status="over budget", reason=(
            f"not run: one call extrapolated to {predicted_s:.0f} s > --max-call-seconds {budget_s:g}"))
        return
    first, hwm = measured_call(backend, call)
    process["peak"] = max(process["peak"], hwm)
    record["first_call_s"] = first["seconds"]
    if backend == "jax" or (backend == "torch" and first["seconds"] >= slow):
        memory = first  # no compilation inside the call: the first call is a sample
    else:
        memory, hwm = measured_call(backend, call)
        process["peak"] = max(process["peak"], hwm)
    record.update({k: v for k, v in memory.items() if k != "seconds"})
    times = [memory["seconds"]]
    while len(times) < repeats and times[0] < slow:
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    record.update(status="ok", times_s=times, median_s=statistics.median(times))
    process["peak"] = max(process["peak"], peak_rss())


def run_point(spec, write=None, guard_limits=None):
    """One (model, mechanism, length) for `spec["modes"]` in this process:
    `{"status", "idle_rss_bytes", "process_peak_bytes", "modes": {mode: record}}`.
    `write(result)` is called after every step (the worker saves it)."""
    import keras
    import numpy as np

    backend = keras.backend.backend()
    result = {"backend": backend, "modes": {}, "status": "ok"}
    write = write or (lambda r: None)
    process = {"peak": 0}
    current = {}

    def on_trip(reason):
        record = current.get("record")
        if record is not None:
            record.update(status="out of memory", reason=reason)
        result["process_peak_bytes"] = max(process["peak"], guard.highest if guard else 0)
        write(result)

    guard = None
    if guard_limits is not None:
        guard = MemoryGuard(guard_limits[0], guard_limits[1], on_trip)
    try:
        config = model_config(spec["model"], spec["mechanism"], spec["length"])
        result["config"] = {k: list(v) if isinstance(v, tuple) else v for k, v in config.items()}
        start = time.perf_counter()
        lm = build_lm(config, spec["seed"])
        result["build_s"] = time.perf_counter() - start
        result["parameters"] = int(lm.count_params())
        rng = np.random.default_rng(spec["seed"])
        length = spec["length"]
        ids = rng.integers(1, config["vocabulary_size"], (1, length)).astype("int32")
        mask = np.ones_like(ids)
        labels = np.concatenate([ids[:, 1:], ids[:, :1]], axis=1)  # next tokens (wrapped)
        gc.collect()
        result["idle_rss_bytes"] = _status_kib("/proc/self/status", "VmRSS") * 1024
        write(result)
        for mode in spec["modes"]:
            record = {"status": "running"}
            result["modes"][mode] = record
            current["record"] = record
            write(result)
            if mode == "forward":
                make = lambda: forward_function(backend, lm, ids, mask)  # noqa: E731
            else:
                make = lambda: train_function(backend, lm, ids, mask, labels)  # noqa: E731
            try:
                run_mode(backend, make, spec["repeats"], spec["slow_call_seconds"], spec["memory_limit_bytes"],
                         record, process, (spec.get("predicted_s") or {}).get(mode), spec.get("max_call_seconds"))
            except Exception as error:  # noqa: BLE001 — recorded; the next mode goes on
                record.update(status="failed", reason=f"{type(error).__name__}: {error}",
                              traceback=traceback.format_exc())
            make = None
            gc.collect()
            write(result)
    except Exception as error:  # noqa: BLE001
        result.update(status="failed", reason=f"{type(error).__name__}: {error}", traceback=traceback.format_exc())
    result["process_peak_bytes"] = max(process["peak"], peak_rss(), guard.highest if guard else 0)
    write(result)
    return result


def worker_main(args):
    """`--worker SPEC`: one point in this (fresh) process; the result as JSON
    to `--worker-output`, rewritten after every step."""
    start_backend(args.threads)
    spec = json.loads(args.worker)
    lock = threading.Lock()

    def write(result):
        with lock:
            temporary = args.worker_output + ".tmp"
            with open(temporary, "w") as f:
                json.dump(result, f)
            os.replace(temporary, args.worker_output)

    run_point(spec, write, guard_limits=(spec["memory_limit_bytes"], spec["min_available_bytes"]))
    return 0


def run_in_subprocess(spec, args, timeout=None):
    """Runs one point in a fresh Python process (killed after `timeout`,
    default `--point-timeout`); its result dict. The process's own peak
    resident size comes from `os.wait4`'s rusage."""
    timeout = timeout or args.point_timeout
    run = run_worker(MODULE, spec, args.threads, timeout, tail_chars=3000)
    returncode, tail = run["returncode"], run["tail"]
    result = run["result"] or {"status": "failed", "modes": {}}
    result["subprocess_s"] = run["seconds"]
    result["subprocess_exit"] = returncode
    result["subprocess_maxrss_bytes"] = run["maxrss_bytes"]  # since the last clear_refs reset, or start
    running = [m for m, r in result["modes"].items() if r.get("status") == "running"]
    if run["timed_out"]:
        for mode in running or [m for m in spec["modes"] if m not in result["modes"]][:1]:
            result["modes"][mode] = dict(result["modes"].get(mode, {}), status="over budget",
                                         reason=f"killed after {timeout:.0f} s (time limit)")
    elif returncode == MemoryGuard.EXIT_CODE:
        pass  # the guard recorded "out of memory" in the running mode
    elif returncode in (-9, 137) and running:
        for mode in running:
            result["modes"][mode].update(status="out of memory", reason="killed by SIGKILL (kernel OOM killer?)")
    elif returncode != 0 or running:
        for mode in running:
            result["modes"][mode].update(status="failed", reason=f"worker exited {returncode}")
        result["output_tail"] = tail
    if result.get("status") == "failed" and "output_tail" not in result:
        result["output_tail"] = tail
    return result


# --------------------------------------------------------------------------- predictions


def measured(rows, mechanism, mode):
    return [r for r in rows if r["mechanism"] == mechanism and r["mode"] == mode and r["status"] == "ok"]


# --------------------------------------------------------------------------- sweep and enwik8 (parent)


def run_sweep(args, backend, spec_base, log):
    """All (mechanism, length) points; one row per (mechanism, mode, length)."""
    rows, points, stopped, predicted_s = [], [], {}, {}
    for mechanism in args.mechanisms:
        for length in args.lengths:
            to_run = []
            for mode in args.modes:
                row = {"mechanism": mechanism, "mode": mode, "length": length}
                if (mechanism, mode) in stopped:
                    rows.append(dict(row, status="not run", reason=f"after {stopped[(mechanism, mode)]}"))
                    continue
                done = measured(rows, mechanism, mode)
                time_guess = extrapolate([(r["length"], r["median_s"]) for r in done], length)
                memory_guess = None
                if backend != "jax" and done:  # JAX: XLA's buffer assignment decides, in the worker
                    call_peak = extrapolate([(r["length"], r["peak_bytes"]) for r in done], length)
                    memory_guess = done[-1]["idle_rss_bytes"] + call_peak
                if memory_guess is not None and memory_guess > args.memory_limit_gib * GIB:
                    reason = (f"not run: idle process + call peak extrapolated to {memory_guess / GIB:.1f} GiB "
                              f"> limit {args.memory_limit_gib:g} GiB")
                    rows.append(dict(row, status="out of memory", reason=reason))
                    stopped[(mechanism, mode)] = f"out of memory at {length}"
                elif backend == "jax":  # the worker checks XLA's memory figure first, then the time
                    predicted_s.setdefault((mechanism, length), {})[mode] = time_guess
                    to_run.append(mode)
                elif time_guess is not None and time_guess > args.max_call_seconds:
                    reason = (f"not run: one call extrapolated to {time_guess:.0f} s "
                              f"> --max-call-seconds {args.max_call_seconds:g}")
                    rows.append(dict(row, status="over budget", reason=reason))
                    stopped[(mechanism, mode)] = f"over budget at {length}"
                else:
                    to_run.append(mode)
            if not to_run:
                log_rows(rows[-len(args.modes):], log)
                continue
            spec = dict(spec_base, model=args.sweep_model, mechanism=mechanism, length=length, modes=to_run,
                        predicted_s=predicted_s.get((mechanism, length), {}), max_call_seconds=args.max_call_seconds)
            result = run_point(spec) if args.in_process else run_in_subprocess(spec, args)
            point = {k: v for k, v in result.items() if k != "modes"}
            point.update(mechanism=mechanism, length=length)
            points.append(point)
            new_rows = []
            for mode in to_run:
                record = result["modes"].get(mode) or {"status": result.get("status", "failed"),
                                                       "reason": result.get("reason", "not reached")}
                row = dict(record, mechanism=mechanism, mode=mode, length=length,
                           idle_rss_bytes=result.get("idle_rss_bytes"),
                           process_peak_bytes=result.get("process_peak_bytes"))
                new_rows.append(row)
                if row["status"] in ("out of memory", "over budget"):
                    stopped[(mechanism, mode)] = f"{row['status']} at {length}"
            rows.extend(new_rows)
            log_rows([r for r in rows if r["mechanism"] == mechanism and r["length"] == length], log)
            if result.get("status") == "failed" or any(r["status"] == "failed" for r in new_rows):
                log(result.get("traceback") or result.get("output_tail") or "")
                for r in new_rows:
                    if r.get("traceback"):
                        log(r["traceback"])
    return rows, points


def run_enwik8(args, spec_base, log):
    """The enwik8-shaped forward at --enwik8-length, halved until it fits."""
    attempts = []
    length = args.enwik8_length
    while length >= args.enwik8_model["attention_options"]["lsh"]["chunk_length"] * 2:
        spec = dict(spec_base, model=args.enwik8_model, mechanism="lsh", length=length, modes=["forward"],
                    repeats=1)
        result = run_point(spec) if args.in_process else run_in_subprocess(spec, args, args.enwik8_timeout)
        record = result["modes"].get("forward") or {"status": result.get("status", "failed"),
                                                     "reason": result.get("reason", "not reached")}
        attempt = {k: v for k, v in result.items() if k != "modes"}
        attempt.update(record, length=length)
        attempts.append(attempt)
        log(f"[enwik8-shaped forward L={length}] {describe(attempt)}; idle {fmt_gib(attempt.get('idle_rss_bytes'))}, "
            f"process peak {fmt_gib(attempt.get('process_peak_bytes'))}, parameters {attempt.get('parameters')}"
            + (f"; subprocess ran {attempt['subprocess_s']:.0f} s" if "subprocess_s" in attempt else ""))
        if attempt["status"] == "failed":
            log(attempt.get("traceback") or attempt.get("output_tail") or "")
        if attempt["status"] != "out of memory":
            break
        length //= 2
    return attempts


# --------------------------------------------------------------------------- output


def fmt_gib(value):
    return "-" if value is None else f"{value / GIB:.2f} GiB"


def describe(row):
    if row["status"] != "ok":
        return f"{row['status']}: {row.get('reason', '')}"
    text = (f"median {row['median_s'] * 1e3:.0f} ms over {len(row['times_s'])} "
            f"(all: {', '.join(f'{t * 1e3:.0f}' for t in row['times_s'])}); call peak +{row['peak_bytes'] / MIB:.0f} MiB")
    if row.get("xla_memory"):
        xla = row["xla_memory"]
        text += f" (XLA temp+output {(xla['temp_bytes'] + xla['output_bytes']) / MIB:.0f} MiB)"
    text += f"; first call {row['first_call_s']:.2f} s"
    if "compile_s" in row:
        text += f" after {row['compile_s']:.1f} s compiling"
    return text


def log_rows(rows, log):
    for row in rows:
        line = f"[{row['mechanism']} {row['mode']} L={row['length']}] {describe(row)}"
        if row["status"] == "ok":
            line += f"; idle {fmt_gib(row.get('idle_rss_bytes'))}, process peak {fmt_gib(row.get('process_peak_bytes'))}"
        log(line)


def find(rows, mechanism, mode, length):
    for row in rows:
        if (row["mechanism"], row["mode"], row["length"]) == (mechanism, mode, length):
            return row
    return {"status": "not run"}


def resident_peak(row):
    """The process's resident size at the peak of the measured call."""
    return row["rss_before_bytes"] + row["peak_rss_bytes"]


def short_status(row):
    return {"out of memory": "OOM", "over budget": "over budget", "not run": "—"}.get(row["status"], row["status"])


def print_tables(payload, log):
    rows, label = payload["rows"], payload["label"]
    model = payload["sweep_model"]
    if rows:
        log(f"\n## {label}: Reformer LM ({model['num_layers']} layers, hidden {model['hidden_dim']}, "
            f"{model['num_heads']} heads × {model['head_dim']}, batch 1): LSH vs full (softmax) attention\n")
        header = ("| mode | L | LSH ms | full ms | full / LSH time | LSH call MiB | full call MiB | "
                  "full / LSH memory | LSH resident GiB | full resident GiB |")
        log(header)
        log("|" + "---|" * (header.count("|") - 1))
        for mode in payload["modes"]:
            for length in payload["lengths"]:
                lsh, full = find(rows, "lsh", mode, length), find(rows, "softmax", mode, length)
                cells = [mode, str(length)]
                ok_l, ok_f = lsh["status"] == "ok", full["status"] == "ok"
                cells.append(f"{lsh['median_s'] * 1e3:.0f}" if ok_l else short_status(lsh))
                cells.append(f"{full['median_s'] * 1e3:.0f}" if ok_f else short_status(full))
                cells.append(f"{full['median_s'] / lsh['median_s']:.1f}×" if ok_l and ok_f else "—")
                cells.append(f"{lsh['peak_bytes'] / MIB:.0f}" if ok_l else short_status(lsh))
                cells.append(f"{full['peak_bytes'] / MIB:.0f}" if ok_f else short_status(full))
                cells.append(f"{full['peak_bytes'] / max(lsh['peak_bytes'], 1):.1f}×" if ok_l and ok_f else "—")
                cells.append(f"{resident_peak(lsh) / GIB:.2f}" if ok_l else "—")
                cells.append(f"{resident_peak(full) / GIB:.2f}" if ok_f else "—")
                log("| " + " | ".join(cells) + " |")
        log("\nms: median wall time of one call; call MiB: peak memory of one call above the process's use "
            "before it\n(RSS; TensorFlow: its CPU allocator's peak); resident GiB: the whole process's resident size "
            "at that call's peak\n(weights, optimizer state, runtime and compiled program included; the idle process "
            "with the model built holds ~1 GiB).")
        reasons = [r for r in rows if r["status"] not in ("ok", "not run")]
        for row in reasons:
            log(f"- {row['mechanism']} {row['mode']} L={row['length']}: {row['status']} — {row.get('reason', '')}")
        log("\nfitted exponents (least squares on log-log, all measured L): time ∝ L^a, call memory ∝ L^b")
        for mechanism in payload["mechanisms"]:
            for mode in payload["modes"]:
                done = measured(rows, mechanism, mode)
                a = fit_exponent([(r["length"], r["median_s"]) for r in done])
                b = fit_exponent([(r["length"], r["peak_bytes"]) for r in done])
                log(f"- {mechanism} {mode}: a = {'-' if a is None else f'{a:.2f}'}, "
                    f"b = {'-' if b is None else f'{b:.2f}'}")
    for attempt in payload.get("enwik8") or []:
        log(f"\nenwik8-shaped forward, L = {attempt['length']}: {describe(attempt)}; idle "
            f"{fmt_gib(attempt.get('idle_rss_bytes'))}, process peak {fmt_gib(attempt.get('process_peak_bytes'))}")


def plot(payloads, path):
    """Log-log time and call memory against L, one row per run (backend):
    a colour per mechanism, solid forward, dashed training step; the first
    length a mechanism could not run is marked in the legend."""
    colours = {"lsh": "tab:green", "softmax": "tab:blue"}
    names = {"lsh": "LSH", "softmax": "full"}
    styles = {"forward": ("-", "o"), "train": ("--", "s")}
    plt, figure, axes = figure_rows(len(payloads))
    for row_axes, payload in zip(axes, payloads):
        rows = payload["rows"]
        for mechanism in payload["mechanisms"]:
            for mode in payload["modes"]:
                done = sorted(measured(rows, mechanism, mode), key=lambda r: r["length"])
                if not done:
                    continue
                stop = [r for r in rows if r["mechanism"] == mechanism and r["mode"] == mode
                        and r["status"] in ("out of memory", "over budget")]
                label = f"{names[mechanism]} {'forward' if mode == 'forward' else 'train step'}"
                if stop:
                    first = min(stop, key=lambda r: r["length"])
                    what = "OOM" if first["status"] == "out of memory" else "over budget"
                    how = ""
                    if "XLA" in first.get("reason", ""):
                        how = ", XLA's figure"
                    elif "extrapolated" in first.get("reason", ""):
                        how = ", extrapolated"
                    label += f" ({what} at {first['length']}{how})"
                line, marker = styles[mode]
                kwargs = dict(color=colours[mechanism], linestyle=line, marker=marker, label=label)
                lengths = [r["length"] for r in done]
                row_axes[0].plot(lengths, [r["median_s"] for r in done], **kwargs)
                row_axes[1].plot(lengths, [max(r["peak_bytes"], 1) / MIB for r in done], **kwargs)
        model = payload["sweep_model"]
        title = (f"{payload['label']}: Reformer LM, {model['num_layers']} layers × {model['num_heads']} heads × "
                 f"{model['head_dim']}, hidden {model['hidden_dim']}, batch 1, CPU")
        log_log_panels(
            row_axes, ("wall time per call (s, median)", "peak memory of one call (MiB)"), "sequence length L", title
        )
        row_axes[0].legend(fontsize=7)
    save_figure(plt, figure, path)


def combine(paths):
    """One payload from several runs of the same backend (see `--combine`)."""
    payloads = []
    for path in paths:
        with open(path) as f:
            payloads.append((path, json.load(f)))
    combined = dict(payloads[0][1])
    sources, rows, mechanisms = {}, [], []
    for mechanism in MECHANISMS:
        for path, payload in reversed(payloads):
            if mechanism in payload.get("mechanisms", []) and payload.get("rows"):
                sources[mechanism] = os.path.basename(path)
                rows += [r for r in payload["rows"] if r["mechanism"] == mechanism]
                mechanisms.append(mechanism)
                for key in ("lengths", "modes"):
                    combined[key] = sorted(set(combined.get(key) or []) | set(payload[key]), key=str)
                break
    combined["lengths"] = sorted(int(x) for x in combined["lengths"])
    combined["modes"] = [m for m in MODES if m in combined["modes"]]
    enwik8 = next((p["enwik8"] for path, p in reversed(payloads) if p.get("enwik8")), None)
    combined.update(
        rows=rows, mechanisms=mechanisms, enwik8=enwik8, combined_from=sources,
        points=[pt for path, p in payloads for pt in p.get("points", [])
                if sources.get(pt.get("mechanism")) == os.path.basename(path)],
        runs=[{"file": os.path.basename(path), "load_average_start": p.get("load_average_start"),
               "load_average_end": p.get("load_average_end"), "elapsed_s": p.get("elapsed_s")}
              for path, p in payloads],
    )
    return combined


# --------------------------------------------------------------------------- main


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        return worker_main(args)
    if args.combine:
        payload = combine(args.combine)
        print_tables(payload, print)
        if args.json:
            write_json(args.json, payload)
            print(f"json: {args.json}")
        if args.plot:
            plot([payload], args.plot)
            print(f"plot: {args.plot}")
        return 0
    if args.replot:
        plot([payload for payload in load_payloads(args.replot) if payload.get("rows")], args.plot)
        print(f"plot: {args.plot}")
        return 0

    limit_threads(args.threads)
    load_start = load_average()
    if args.in_process:
        backend, _ = start_backend(args.threads)
    else:
        backend = os.environ.get("KERAS_BACKEND", "(Keras default)")
    label = args.backend_label or backend

    def log(text):
        print(text)
        sys.stdout.flush()

    spec_base = {
        "seed": args.seed,
        "repeats": max(1, args.repeats),
        "slow_call_seconds": args.slow_call_seconds,
        "memory_limit_bytes": int(args.memory_limit_gib * GIB),
        "min_available_bytes": int(args.min_available_gib * GIB),
    }
    log(f"# Reformer LSH vs full attention benchmark, backend={label}")
    log(f"{cpu_line(args.threads)}; "
        f"memory: {(_status_kib('/proc/meminfo', 'MemTotal') or 0) / 1024**2:.1f} GiB total, "
        f"{(_status_kib('/proc/meminfo', 'MemAvailable') or 0) / 1024**2:.1f} GiB available at the start")
    log(f"parts: {', '.join(args.parts)}; sweep model {args.sweep_model}; lengths {args.lengths}; "
        f"mechanisms {args.mechanisms}; modes {args.modes}; repeats {args.repeats} (one if slower than "
        f"{args.slow_call_seconds:g} s); memory limit {args.memory_limit_gib:g} GiB, call budget "
        f"{args.max_call_seconds:g} s, point timeout {args.point_timeout:g} s; "
        f"{'in this process' if args.in_process else 'a fresh process per (mechanism, length)'}")
    log(load_line("start", load_start))
    started = time.perf_counter()
    rows, points, enwik8 = [], [], None
    if "sweep" in args.parts:
        rows, points = run_sweep(args, backend, spec_base, log)
    if "enwik8" in args.parts:
        log(f"\nenwik8-shaped model: {args.enwik8_model}")
        enwik8 = run_enwik8(args, spec_base, log)
    backend = next((p.get("backend") for p in points + (enwik8 or []) if p.get("backend")), backend)
    payload = {
        "backend": backend,
        "label": args.backend_label or backend,
        "cpu": cpu_model(),
        "logical_cores": os.cpu_count(),
        "memory_total_bytes": (_status_kib("/proc/meminfo", "MemTotal") or 0) * 1024,
        "threads": args.threads,
        "python": platform.python_version(),
        "versions": versions(backend, extra=("matplotlib",)),
        "sweep_model": args.sweep_model,
        "enwik8_model": args.enwik8_model,
        "lengths": args.lengths,
        "mechanisms": args.mechanisms,
        "modes": args.modes,
        "repeats": args.repeats,
        "slow_call_seconds": args.slow_call_seconds,
        "memory_limit_gib": args.memory_limit_gib,
        "max_call_seconds": args.max_call_seconds,
        "point_timeout": args.point_timeout,
        "in_process": args.in_process,
        "load_average_start": load_start,
        "load_average_end": load_average(),
        "elapsed_s": time.perf_counter() - started,
        "rows": rows,
        "points": points,
        "enwik8": enwik8,
    }
    print_tables(payload, log)
    log("\nversions: " + fmt_versions(payload["versions"]))
    log(load_line("end", payload["load_average_end"]))
    log(f"elapsed: {payload['elapsed_s']:.0f} s")
    write_json(args.json, payload)
    if args.plot and rows:
        plot([payload], args.plot)
        log(f"plot: {args.plot}")
    failed = [r for r in rows + (enwik8 or []) if r["status"] == "failed"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
