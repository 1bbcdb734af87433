"""Generation time per new token and decoding-cache memory against context
length: GPTCausalLM with linear attention (a constant-size recurrent state)
against softmax attention (a key/value cache).

Model (both mechanisms, the same random weights: linear attention adds no
weights): ``GPTBackbone(vocabulary_size=1000, num_layers=4, num_heads=4,
hidden_dim=256, intermediate_dim=1024, max_sequence_length=max context + n
rounded up to a multiple of 64,
dropout=0.0, attention_dropout=0.0, attention=...)`` in
``GPTCausalLM(preprocessor=None)``; batch 1; greedy
``generate({"token_ids", "padding_mask"}, max_new_tokens=n,
stop_token_ids=None)``.

**Time per new token at context c.** A ``generate`` call runs one compiled
program: the prompt pass over the c-token prompt, then a loop of one
decoding step per new token. The per-token time is the difference of two
calls that run *the same program on the same buffers* and differ only in
how many loop iterations they make:

    long:  generate(prompt, max_new_tokens=n, stop_token_ids=None)     n steps
    short: generate(prompt, max_new_tokens=n, stop_token_ids=[s])      1 step
    time per token(c) = (t_long − t_short) / (n − 1)

where ``s`` is the first token the long call generates (greedy, so the
short call emits ``s`` first and stops there; checked on every call). Both
calls have the same ``max_new_tokens``, hence the same buffer
(``generate`` rounds ``c + n`` up to a multiple of 64,
``generative_task.BUFFER_MULTIPLE``) and the same prompt pass; changing
``max_new_tokens`` instead would change the buffer, and a softmax prompt
pass attends over the whole buffer, so the prompt pass would not cancel.
(The stop id is also the pad id, a constant of the compiled program, so
the short call runs a second compilation of the same program.) n = 512
by default: with a gap of only ~60 tokens the jitter of the prompt pass
(0.5 s for linear, 5 s for softmax at c = 8192 on JAX) swamped the
difference (per-round values went negative).

What the difference contains: n − 1 loop iterations (decoding step,
greedy choice, buffer bookkeeping) at positions c + 1 … c + n − 1. For
softmax every step attends over the whole key/value cache of
``buffer = c + n`` (rounded) positions, masked, so its per-token time is
that of a ``c + n`` cache; the linear recurrent state has no length.

Each (mechanism, context) is warmed up (both programs compiled) first; then
``--rounds`` rounds, each timing both calls of both mechanisms,
interleaved (the mechanisms' order rotates, and short/long alternate), and
the median over rounds of the per-round per-token time is reported, with
its interquartile range.

**Memory.** The decoding cache: the sum of the bytes of the tensors of
``lm.init_cache(1, buffer)`` (the cache ``generate`` allocates), per
sequence. Measured too, after the timed rounds: the peak resident memory
of the process during one long ``generate`` call, above its resident size
just before (``timing.reset_peak_rss``: ``malloc_trim`` and the kernel's
peak-RSS counter reset), which includes the prompt pass's temporaries.

Example::

    KERAS_BACKEND=jax python -m benchmarks.linear_generation_benchmark
    KERAS_BACKEND=jax python -m benchmarks.linear_generation_benchmark --tiny   # seconds-long smoke run
"""

import argparse
import os
import platform
import statistics
import sys
import time

# Shared helpers (stdlib-only at import time, so they run before numpy/Keras).
from benchmarks.contenders import round_robin
from benchmarks.plots import add_plot_arguments
from benchmarks.plots import check_plot_arguments
from benchmarks.plots import figure_rows
from benchmarks.plots import load_payloads
from benchmarks.plots import log_log_panels
from benchmarks.plots import save_figure
from benchmarks.timing import cpu_line
from benchmarks.timing import cpu_model
from benchmarks.timing import fmt_versions
from benchmarks.timing import load_average
from benchmarks.timing import load_line
from benchmarks.timing import peak_rss
from benchmarks.timing import reset_peak_rss
from benchmarks.timing import start_backend
from benchmarks.timing import versions
from benchmarks.timing import write_json

MECHANISMS = ("linear", "softmax")
MODEL = dict(vocabulary_size=1000, num_layers=4, num_heads=4, hidden_dim=256, intermediate_dim=1024)
DEFAULT_CONTEXTS = [256 * 2**i for i in range(6)]  # 256 … 8192
# A seconds-long smoke run of the script itself (--tiny); not a benchmark.
TINY_MODEL = dict(vocabulary_size=1000, num_layers=2, num_heads=2, hidden_dim=64, intermediate_dim=128)
TINY_CONTEXTS = [64, 128]
TINY_NEW_TOKENS = 32
TARGET_RATIO = 1.2  # the target for linear: per-token time longest / shortest context
MIB = 1024**2


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=None, help="prompt lengths (default 256 … 8192)")
    parser.add_argument(
        "--mechanisms", default=",".join(MECHANISMS), help="comma-separated subset of " + ",".join(MECHANISMS)
    )
    parser.add_argument(
        "--new-tokens", type=int, default=None, help="n, max_new_tokens of both calls (default 512; 32 with --tiny)"
    )
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds per context (median reported)")
    parser.add_argument(
        "--threads", type=int, default=os.cpu_count(), help="intra-op threads (default: all cores)"
    )
    parser.add_argument("--backend-label", default=None, help="label of this run (default: the backend's name)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights and the prompts")
    parser.add_argument("--tiny", action="store_true", help="seconds-long smoke run: 2 layers, 64 wide, contexts 64, 128")
    parser.add_argument("--json", default=None, help="write the results to this JSON file")
    add_plot_arguments(parser, "time per token, memory")
    args = parser.parse_args(argv)
    check_plot_arguments(parser, args)
    args.model = dict(TINY_MODEL if args.tiny else MODEL)
    if args.tiny:
        args.contexts = args.contexts or TINY_CONTEXTS
        args.rounds = min(args.rounds, 2)
    args.contexts = sorted(args.contexts or DEFAULT_CONTEXTS)
    args.mechanisms = [m.strip() for m in args.mechanisms.split(",") if m.strip()]
    unknown = sorted(set(args.mechanisms) - set(MECHANISMS))
    if unknown:
        parser.error(f"unknown mechanisms: {', '.join(unknown)}")
    if args.new_tokens is None:
        args.new_tokens = TINY_NEW_TOKENS if args.tiny else 512
    if args.new_tokens < 2:
        parser.error("--new-tokens must be at least 2")
    return args


def buffer_length(context, new_tokens, multiple, limit):
    """The buffer `GPTCausalLM.generate` allocates for one prompt of
    `context` tokens and `new_tokens` more (its `_round_up`)."""
    end = context + new_tokens
    return max(end, min(-(-end // multiple) * multiple, limit))


def cache_bytes(lm, length):
    """Bytes of `lm.init_cache(1, length)`: every layer's cache tensors."""
    import keras
    import numpy as np

    tensors = keras.tree.flatten(lm.init_cache(1, length))
    return int(sum(np.prod(t.shape) * np.dtype(keras.backend.standardize_dtype(t.dtype)).itemsize for t in tensors))


def build(mechanism, model, max_sequence_length, seed):
    """A `GPTCausalLM` with `attention=mechanism`, seeded random weights."""
    import keras

    from attention_zoo_keras.models import GPTBackbone
    from attention_zoo_keras.models import GPTCausalLM

    keras.utils.set_random_seed(seed)
    backbone = GPTBackbone(
        **model, max_sequence_length=max_sequence_length, dropout=0.0, attention_dropout=0.0, attention=mechanism
    )
    return GPTCausalLM(backbone=backbone, preprocessor=None)


def generators(lm, prompt, new_tokens):
    """`(long(), short(), stop id, first long call's seconds)` for the
    `(1, c)` prompt: `long()` times `generate(max_new_tokens=new_tokens,
    stop_token_ids=None)`, `short()` the same call stopping at the first
    generated token. Each checks that the prompt came back and that it
    generated exactly `new_tokens`, respectively 1, tokens."""
    import numpy as np

    inputs = {"token_ids": prompt, "padding_mask": np.ones_like(prompt)}
    context = prompt.shape[1]

    def timed(stop_token_ids, expected):
        start = time.perf_counter()
        out = lm.generate(inputs, max_new_tokens=new_tokens, stop_token_ids=stop_token_ids)
        elapsed = time.perf_counter() - start
        token_ids, valid = np.asarray(out["token_ids"]), np.asarray(out["padding_mask"]).astype(bool)
        assert (token_ids[:, :context] == prompt).all(), "the prompt did not come back unchanged"
        generated = token_ids.shape[1] - context
        assert generated == expected and valid.all(), f"generated {generated} tokens, expected {expected}"
        return elapsed, token_ids

    first_s, token_ids = timed(None, new_tokens)
    stop_id = int(token_ids[0, context])

    def long():
        return timed(None, new_tokens)[0]

    def short():
        return timed([stop_id], 1)[0]

    return long, short, stop_id, first_s


def quartiles(values):
    """`(25th, 75th)` percentiles (inclusive method; the values themselves for fewer than two)."""
    if len(values) < 2:
        return values[0], values[0]
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], q[2]


def summarise(entry, steps):
    """Adds the per-token medians and quartiles to one (mechanism, context)
    entry; `steps` = loop iterations the long call makes more than the short."""
    per_token = [(long - short) / steps for short, long in zip(entry["short_s"], entry["long_s"])]
    entry["per_token_s"] = per_token
    entry["per_token_median_s"] = statistics.median(per_token)
    entry["per_token_quartiles_s"] = quartiles(per_token)
    entry["short_median_s"] = statistics.median(entry["short_s"])
    entry["long_median_s"] = statistics.median(entry["long_s"])


# --------------------------------------------------------------------------- plot


def plot(payloads, path):
    """Per-token time and memory against context, log-log, one row per run."""
    colours = {"linear": "tab:green", "softmax": "tab:blue"}
    plt, figure, axes = figure_rows(len(payloads))
    for row, payload in zip(axes, payloads):
        for mechanism in payload["mechanisms"]:
            entries = [payload["results"][mechanism][str(c)] for c in payload["contexts"]]
            contexts = payload["contexts"]
            median = [e["per_token_median_s"] * 1e3 for e in entries]
            low = [m - e["per_token_quartiles_s"][0] * 1e3 for m, e in zip(median, entries)]
            high = [e["per_token_quartiles_s"][1] * 1e3 - m for m, e in zip(median, entries)]
            row[0].errorbar(
                contexts, median, yerr=[low, high], color=colours[mechanism], marker="o", capsize=3,
                label=f"{mechanism} (median, IQR)",
            )
            row[1].plot(
                contexts, [e["cache_bytes"] / MIB for e in entries], color=colours[mechanism], marker="o",
                label=f"{mechanism}: decoding cache",
            )
            row[1].plot(
                contexts, [max(e["peak_rss_bytes"], 1) / MIB for e in entries], color=colours[mechanism],
                marker="s", linestyle="--", label=f"{mechanism}: peak RSS of a generate call",
            )
        model = payload["model"]
        title = (
            f"{payload['label']}: GPT {model['num_layers']} layers, hidden {model['hidden_dim']}, "
            f"{model['num_heads']} heads, batch 1"
        )
        labels = ("time per new token (ms)", "memory per sequence (MiB)")
        log_log_panels(row, labels, "context (prompt tokens)", title, legend=True)
    save_figure(plt, figure, path)


# --------------------------------------------------------------------------- main


def print_tables(payload):
    """Per-context table, ratios and the target check, as Markdown."""
    results, contexts = payload["results"], payload["contexts"]
    n = payload["new_tokens"]
    print(
        f"\n## {payload['label']}: time per new token (median over {payload['rounds']} rounds of "
        f"(t_long - t_short) / {n - 1}, max_new_tokens={n}) and memory per sequence\n"
    )
    header = ["context", "buffer"]
    for mechanism in payload["mechanisms"]:
        header += [
            f"{mechanism} ms/token", f"{mechanism} IQR", f"{mechanism} t_short ms", f"{mechanism} cache MiB",
            f"{mechanism} peak MiB",
        ]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for context in contexts:
        first = results[payload["mechanisms"][0]][str(context)]
        cells = [str(context), str(first["buffer_length"])]
        for mechanism in payload["mechanisms"]:
            e = results[mechanism][str(context)]
            q1, q3 = e["per_token_quartiles_s"]
            cells += [
                f"{e['per_token_median_s'] * 1e3:.3f}", f"{q1 * 1e3:.3f}–{q3 * 1e3:.3f}",
                f"{e['short_median_s'] * 1e3:.1f}", f"{e['cache_bytes'] / MIB:.3f}", f"{e['peak_rss_bytes'] / MIB:.1f}",
            ]
        print("| " + " | ".join(cells) + " |")
    print(
        "\nt_short = the short call (prompt pass + 1 token); cache MiB = bytes of init_cache(1, buffer);"
        "\npeak MiB = peak resident memory during one long generate call above the resident size before it."
    )
    print(f"\n## {payload['label']}: longest / shortest context ({contexts[-1]} / {contexts[0]})\n")
    print("| mechanism | per-token time ratio | cache ratio |")
    print("|---|---|---|")
    for mechanism in payload["mechanisms"]:
        ratios = payload["ratios"][mechanism]
        print(f"| {mechanism} | {ratios['per_token']:.2f} | {ratios['cache']:.2f} |")
    if "linear" in payload["ratios"]:
        ratio = payload["ratios"]["linear"]["per_token"]
        cache = payload["ratios"]["linear"]["cache"]
        verdict = "MET" if ratio <= TARGET_RATIO and cache == 1.0 else "NOT MET"
        print(
            f"\ntarget (linear: per-token ratio <= {TARGET_RATIO}, constant cache): {verdict} "
            f"(ratio {ratio:.2f}, cache ratio {cache:.2f})"
        )


def main(argv=None):
    args = parse_args(argv)
    if args.replot:
        plot(load_payloads(args.replot), args.plot)
        print(f"plot: {args.plot}")
        return 0

    load_start = load_average()
    backend, _ = start_backend(args.threads)
    import numpy as np

    from attention_zoo_keras.models.generative_task import BUFFER_MULTIPLE

    label = args.backend_label or backend
    n = args.new_tokens
    max_sequence_length = -(-(args.contexts[-1] + n) // BUFFER_MULTIPLE) * BUFFER_MULTIPLE
    print(f"# linear vs softmax generation benchmark, backend={label}")
    print(
        "model: " + ", ".join(f"{k} {v}" for k, v in args.model.items())
        + f", max_sequence_length {max_sequence_length}; dropout 0, random weights; batch 1, greedy"
    )
    print(cpu_line(args.threads))
    print(fmt_versions(versions(backend)))
    print(
        f"contexts {', '.join(map(str, args.contexts))}; max_new_tokens {n} (long: {n} tokens, short: stops "
        f"after 1); rounds {args.rounds} (mechanisms interleaved)"
    )
    print(load_line("start", load_start))
    sys.stdout.flush()

    models = {}
    for mechanism in args.mechanisms:
        start = time.perf_counter()
        models[mechanism] = build(mechanism, args.model, max_sequence_length, args.seed)
        print(
            f"[{mechanism}] {models[mechanism].count_params():,} parameters, built in "
            f"{time.perf_counter() - start:.1f}s; decoding cache: {type(models[mechanism].decoding).__name__}"
        )
    sys.stdout.flush()

    results = {mechanism: {} for mechanism in args.mechanisms}
    started = time.perf_counter()
    rng = np.random.default_rng(args.seed)
    for context in args.contexts:
        prompt = rng.integers(1, args.model["vocabulary_size"], size=(1, context)).astype("int32")
        buffer = buffer_length(context, n, BUFFER_MULTIPLE, max_sequence_length)
        print(f"\n## context {context}: buffer {buffer} for both calls")
        calls = {}
        for mechanism, lm in models.items():
            long, short, stop_id, first_long = generators(lm, prompt, n)
            start = time.perf_counter()
            short()  # compiles the short call's program (its pad id is the stop id)
            first_short = time.perf_counter() - start
            calls[mechanism] = (long, short)
            entry = results[mechanism][str(context)] = {
                "buffer_length": buffer,
                "stop_token_id": stop_id,
                "first_calls_s": [first_long, first_short],
                "cache_bytes": cache_bytes(lm, buffer),
                "short_s": [],
                "long_s": [],
            }
            print(
                f"[{mechanism}] first calls (compile) long {first_long:.2f} s, short {first_short:.2f} s "
                f"(stops at id {stop_id}); cache {entry['cache_bytes'] / MIB:.3f} MiB"
            )
            sys.stdout.flush()
        names = list(models)
        for round_index, order in enumerate(round_robin(names, args.rounds)):
            for mechanism in order:
                entry = results[mechanism][str(context)]
                long, short = calls[mechanism]
                if round_index % 2:
                    entry["long_s"].append(long())
                    entry["short_s"].append(short())
                else:
                    entry["short_s"].append(short())
                    entry["long_s"].append(long())
        for mechanism in names:
            entry = results[mechanism][str(context)]
            baseline, entry["memory_method"] = reset_peak_rss()
            calls[mechanism][0]()  # after the timed rounds: a warm process
            entry["peak_rss_bytes"] = max(0, peak_rss() - baseline)
            summarise(entry, n - 1)
            q1, q3 = entry["per_token_quartiles_s"]
            print(
                f"[{mechanism}] context {context}: {entry['per_token_median_s'] * 1e3:.3f} ms/token "
                f"(IQR {q1 * 1e3:.3f}–{q3 * 1e3:.3f}; t_short median {entry['short_median_s'] * 1e3:.1f} ms, "
                f"t_long median {entry['long_median_s'] * 1e3:.1f} ms; per round: "
                f"{', '.join(f'{t * 1e3:.3f}' for t in entry['per_token_s'])}); peak of a long call "
                f"+{entry['peak_rss_bytes'] / MIB:.1f} MiB"
            )
        sys.stdout.flush()

    first, last = str(args.contexts[0]), str(args.contexts[-1])
    ratios = {}
    for mechanism in args.mechanisms:
        shortest, longest = results[mechanism][first], results[mechanism][last]
        ratios[mechanism] = {
            "per_token": longest["per_token_median_s"] / shortest["per_token_median_s"],
            "cache": longest["cache_bytes"] / shortest["cache_bytes"],
        }
    payload = {
        "backend": backend,
        "label": label,
        "cpu": cpu_model(),
        "logical_cores": os.cpu_count(),
        "threads": args.threads,
        "python": platform.python_version(),
        "versions": versions(backend, extra=("matplotlib",)),
        "model": dict(args.model, max_sequence_length=max_sequence_length),
        "contexts": args.contexts,
        "mechanisms": args.mechanisms,
        "new_tokens": n,
        "rounds": args.rounds,
        "load_average_start": load_start,
        "load_average_end": load_average(),
        "elapsed_s": time.perf_counter() - started,
        "results": results,
        "ratios": ratios,
    }
    print_tables(payload)
    print(load_line("end", payload["load_average_end"]))
    print(f"elapsed: {payload['elapsed_s']:.0f} s")
    write_json(args.json, payload)
    if args.plot:
        plot([payload], args.plot)
        print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
