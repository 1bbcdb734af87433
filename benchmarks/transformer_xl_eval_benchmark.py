"""Evaluation speed of Transformer-XL with its segment memory against a
vanilla Transformer that recomputes its whole context window for every
predicted token, at the same attention length (Dai et al., 2019, §4.4 and
Table 9: "up to 1,874 times faster during evaluation").

The Keras backend is the one KERAS_BACKEND names; run the script once per
backend (``bash benchmarks/run.sh transformer_xl_eval`` does all three).
Weights are random: nothing is downloaded.

**Model.** One randomly initialised ``TransformerXLCausalLM`` (seeded; the
weights do not depend on ``mem_len``, so every attention length gets the
same weights, copied from the first model built):
``TransformerXLBackbone(vocabulary_size=10000, num_layers=4, num_heads=8,
hidden_dim=256, head_dim=32, intermediate_dim=1024, cutoffs=[2000, 5000],
div_val=2, same_length=True, clamp_len=0, dropout=0, attention_dropout=0,
mem_len=A)`` with the tied adaptive softmax head (``lm_head``). Batch 1 for
both contenders, as in the paper's evaluation.

**Attention length A.** With ``same_length=True`` every query of a
Transformer-XL attends to exactly ``mem_len`` keys (the window slides over
memory and segment), so ``mem_len = A`` is attention length A.

**Transformer-XL with memory** reads the token stream in segments of
``--segment-length`` tokens (default 128, the ``tgt_len`` of the authors'
WikiText-103 evaluation) and carries the memory from segment to segment;
one compiled call per segment::

    out = backbone({"token_ids": segment (1, L), "memory": memory (1, layers, A, 256)})
    nll terms = lm_head.token_log_probabilities(out["sequence_output"], next tokens)
    memory = out["memory"]

Time per predicted token = time of one segment call / L. The memory starts
as A zero vectors (``backbone.initial_memory(1)``, the ``transformers``
start: every segment then has the same shapes, so one compiled program);
the first ``max(ceil(A / L), 1 + warmup)`` segments replace the zeros by
real states and are not timed (they also compile and warm the program up),
then every timed segment continues the stream.

**Vanilla** is the same model without memory
(``backbone.initial_memory(1, 0)``, an empty memory) over the window of the
A tokens before each predicted token, keeping only the last position's
prediction: what a fixed-context Transformer must do to give every token A
tokens of context (Al-Rfou et al., 2018, the paper's baseline). One
compiled call per predicted token::

    out = backbone({"token_ids": stream[t − A : t] (1, A), "memory": empty (1, layers, 0, 256)})
    nll term = lm_head.token_log_probabilities(out["sequence_output"][:, −1:], stream[t])

Time per predicted token = time of one window call. (Batching several
windows would amortise the weights' reads, but the paper's comparison,
and this one, is per token at batch 1.)

Both compute the full adaptive log-softmax for each predicted token and
gather the target's log-probability (what evaluation accumulates), and
both return it to the host (numpy) at every call, as an evaluation loop
would. Compilation: ``backend_support.compile_inference`` (JAX ``jax.jit``
with the weights as arguments, TensorFlow ``tf.function(jit_compile=True)``)
around ``backend_support.compile_step`` (torch: ``torch.jit.trace``, one
trace per input shape, run under ``torch.no_grad()``; JAX/TensorFlow: the
function itself) — what ``generate`` uses.

**Rounds.** For each A: both functions are compiled (first call, timed
separately) and warmed up (``--warmup`` more untimed calls each; torch's
TorchScript executor optimises a trace over its first calls), then
``--rounds`` rounds each time one XL segment and one vanilla window
(alternating which goes first); the median over rounds is reported, with
the speedup = vanilla ms/token ÷ XL ms/token. If the vanilla calls at an A
are predicted (quadratically from the previous A) to take longer than
``--max-point-seconds``, vanilla is skipped there and the row says so.

**Equal attention length, not equal predictions.** With one layer, XL's
prediction for a token equals the vanilla window's (both attend to the
same A input embeddings at the same distances); the script checks that on
a 1-layer copy of the configuration (``--no-check`` skips it). With L
layers XL's effective context is up to L × A tokens (each layer's memory
holds states that saw A tokens further back), so its predictions differ
from the vanilla window's: the comparison is at equal attention length,
as the paper's is.

Example::

    KERAS_BACKEND=jax python -m benchmarks.transformer_xl_eval_benchmark
    KERAS_BACKEND=jax python -m benchmarks.transformer_xl_eval_benchmark --attention-lengths 128 512 --rounds 5
    KERAS_BACKEND=torch python -m benchmarks.transformer_xl_eval_benchmark --tiny   # seconds-long smoke run
"""

import argparse
import math
import os
import platform
import statistics
import sys
import time

# Shared helpers (stdlib-only at import time, so they run before numpy/Keras).
from benchmarks.timing import cpu_line
from benchmarks.timing import cpu_model
from benchmarks.timing import fmt_versions
from benchmarks.timing import load_average
from benchmarks.timing import load_line
from benchmarks.timing import start_backend
from benchmarks.timing import versions
from benchmarks.timing import write_json

MODEL = dict(
    vocabulary_size=10000, num_layers=4, num_heads=8, hidden_dim=256, head_dim=32, intermediate_dim=1024,
    cutoffs=[2000, 5000], div_val=2,
)
DEFAULT_ATTENTION_LENGTHS = [128, 256, 512, 1024, 1600]
DEFAULT_SEGMENT_LENGTH = 128
# A seconds-long smoke run of the script itself (--tiny); not a benchmark.
TINY_MODEL = dict(
    vocabulary_size=1000, num_layers=2, num_heads=4, hidden_dim=64, head_dim=16, intermediate_dim=128,
    cutoffs=[200, 500], div_val=2,
)
TINY_ATTENTION_LENGTHS = [32, 64]
TINY_SEGMENT_LENGTH = 16
CHECK_TOLERANCE = 1e-4  # max |log p| difference, XL vs vanilla, 1-layer model
CHECK_POSITIONS = 4  # predicted tokens compared in the 1-layer check


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--attention-lengths", type=int, nargs="+", default=None,
        help="attention lengths A = mem_len (default 128 256 512 1024 1600)",
    )
    parser.add_argument(
        "--segment-length", type=int, default=None, help="XL segment length L (default 128; 16 with --tiny)"
    )
    parser.add_argument(
        "--rounds", type=int, default=15, help="timed rounds per A (one XL segment + one window each; default 15)"
    )
    parser.add_argument(
        "--warmup", type=int, default=2,
        help="untimed calls of each function after its first (compiling) call (default 2)",
    )
    parser.add_argument(
        "--max-point-seconds", type=float, default=180.0,
        help="skip vanilla at an A whose calls are predicted to take longer than this (default 180)",
    )
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="intra-op threads (default: all cores)")
    parser.add_argument("--backend-label", default=None, help="label of this run (default: the backend's name)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights and the token stream")
    parser.add_argument("--no-check", action="store_true", help="skip the 1-layer XL = vanilla check")
    parser.add_argument("--tiny", action="store_true", help="seconds-long smoke run: 2 layers, 64 wide, A 32, 64")
    parser.add_argument("--json", default=None, help="write the results to this JSON file")
    args = parser.parse_args(argv)
    args.model = dict(TINY_MODEL if args.tiny else MODEL)
    if args.tiny:
        args.attention_lengths = args.attention_lengths or TINY_ATTENTION_LENGTHS
        args.segment_length = args.segment_length or TINY_SEGMENT_LENGTH
        args.rounds = min(args.rounds, 2)
    args.attention_lengths = sorted(args.attention_lengths or DEFAULT_ATTENTION_LENGTHS)
    args.segment_length = args.segment_length or DEFAULT_SEGMENT_LENGTH
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    return args


def build(model, attention_length, seed, num_layers=None, weights_from=None):
    """A `TransformerXLCausalLM` with `mem_len = same-length span =
    attention_length`, seeded random weights (or those of `weights_from`)."""
    import keras

    from attention_zoo_keras.models.transformer_xl.transformer_xl_backbone import TransformerXLBackbone
    from attention_zoo_keras.models.transformer_xl.transformer_xl_causal_lm import TransformerXLCausalLM

    keras.utils.set_random_seed(seed)
    config = dict(model)
    if num_layers is not None:
        config["num_layers"] = num_layers
    backbone = TransformerXLBackbone(
        **config, mem_len=attention_length, same_length=True, clamp_len=0, dropout=0.0, attention_dropout=0.0
    )
    lm = TransformerXLCausalLM(backbone=backbone, preprocessor=None)
    if weights_from is not None:
        lm.set_weights(weights_from.get_weights())
    return lm


def compiled_functions(lm):
    """`(xl_segment, vanilla_window)`, each compiled for this backend:

    * `xl_segment(token_ids (1, L), targets (1, L), memory)` → `(log p of
      the targets (1, L), next memory)`;
    * `vanilla_window(token_ids (1, A), target (1, 1), empty memory)` →
      `log p of the target after the last position (1, 1)`.
    """
    from attention_zoo_keras.backend_support import compile_inference
    from attention_zoo_keras.backend_support import compile_step

    backbone, head = lm.backbone, lm.lm_head
    variables = lm.variables

    def xl_segment(token_ids, targets, memory):
        out = backbone({"token_ids": token_ids, "memory": memory}, training=False)
        return head.token_log_probabilities(out["sequence_output"], targets), out["memory"]

    def vanilla_window(token_ids, target, memory):
        out = backbone({"token_ids": token_ids, "memory": memory}, training=False)
        return head.token_log_probabilities(out["sequence_output"][:, -1:, :], target)

    return (
        compile_inference(compile_step(xl_segment, variables), variables),
        compile_inference(compile_step(vanilla_window, variables), variables),
    )


def to_numpy(x):
    import keras

    return keras.ops.convert_to_numpy(x)


def wait(x):
    """Blocks until the device value `x` is computed (JAX dispatches asynchronously)."""
    if hasattr(x, "block_until_ready"):
        x.block_until_ready()
    return x


class Stream:
    """The evaluation stream at one attention length: XL segments with the
    memory carried, and vanilla windows, over the same random tokens."""

    def __init__(self, lm, tokens, segment_length):
        self.lm, self.tokens, self.length = lm, tokens, segment_length
        self.attention_length = lm.backbone.mem_len
        self.xl, self.vanilla = compiled_functions(lm)
        self.memory = lm.backbone.initial_memory(1)  # A zero vectors: constant shapes
        self.empty = lm.backbone.initial_memory(1, 0)
        self.position = 0  # the next XL segment starts here
        self.window_end = self.attention_length  # the next vanilla window predicts this token

    def xl_segment(self):
        """One segment: `(seconds, log p (L,), first predicted position)`."""
        start, stop = self.position, self.position + self.length
        ids = self.tokens[None, start:stop]
        targets = self.tokens[None, start + 1 : stop + 1]
        began = time.perf_counter()
        log_probs, memory = self.xl(ids, targets, self.memory)
        log_probs = to_numpy(log_probs)
        wait(memory)
        elapsed = time.perf_counter() - began
        self.memory, self.position = memory, stop
        return elapsed, log_probs[0], start + 1

    def vanilla_window(self, end=None):
        """The window of the A tokens before position `end` (default: the
        next one): `(seconds, log p of token end)`."""
        if end is None:
            end, self.window_end = self.window_end, self.window_end + 1
        ids = self.tokens[None, end - self.attention_length : end]
        target = self.tokens[None, end : end + 1]
        began = time.perf_counter()
        log_prob = to_numpy(self.vanilla(ids, target, self.empty))
        return time.perf_counter() - began, float(log_prob[0, 0])

    def fill_memory(self, at_least=1):
        """Runs `at_least` segments, and more until the memory holds only
        real states; returns their seconds."""
        count = max(at_least, math.ceil(self.attention_length / self.length))
        return [self.xl_segment()[0] for _ in range(count)]


def check_equal_predictions(args, attention_length, tokens):
    """1-layer model: XL's log p for tokens of a segment after the memory is
    full of real states equals the vanilla window's."""
    import numpy as np

    lm = build(args.model, attention_length, args.seed, num_layers=1)
    stream = Stream(lm, tokens, args.segment_length)
    stream.fill_memory()
    _, log_probs, first = stream.xl_segment()
    offsets = np.linspace(0, args.segment_length - 1, CHECK_POSITIONS).round().astype(int)
    differences = []
    for offset in offsets:
        _, vanilla = stream.vanilla_window(end=first + offset)
        differences.append(abs(float(log_probs[offset]) - vanilla))
    return {
        "num_layers": 1,
        "attention_length": attention_length,
        "positions": [int(first + o) for o in offsets],
        "max_abs_difference": max(differences),
        "tolerance": CHECK_TOLERANCE,
        "passed": max(differences) <= CHECK_TOLERANCE,
    }


def print_table(payload):
    print(
        f"\n## {payload['label']}: evaluation time per predicted token, batch 1 (median over "
        f"{payload['rounds']} rounds); XL segments of {payload['segment_length']} tokens with memory A, "
        f"vanilla: one forward over the A previous tokens per token\n"
    )
    print("| attention length A | XL ms/token | vanilla ms/token | speedup (vanilla / XL) |")
    print("|---|---|---|---|")
    for a in payload["attention_lengths"]:
        entry = payload["results"][str(a)]
        if entry.get("vanilla_skipped"):
            vanilla, speedup = f"skipped ({entry['vanilla_skipped']})", "—"
        else:
            vanilla, speedup = f"{entry['vanilla_ms_per_token']:.2f}", f"{entry['speedup']:.0f}×"
        print(f"| {a} | {entry['xl_ms_per_token']:.3f} | {vanilla} | {speedup} |")


def main(argv=None):
    args = parse_args(argv)
    load_start = load_average()
    backend, _ = start_backend(args.threads)
    import numpy as np

    label = args.backend_label or backend
    L, lengths = args.segment_length, args.attention_lengths
    print(f"# Transformer-XL evaluation benchmark (memory vs recomputed window), backend={label}")
    print(
        "model: " + ", ".join(f"{k} {v}" for k, v in args.model.items())
        + "; same_length, clamp_len 0, dropout 0, tied adaptive softmax, random weights; batch 1"
    )
    print(cpu_line(args.threads))
    print(fmt_versions(versions(backend)))
    print(
        f"attention lengths {', '.join(map(str, lengths))}; XL segment length {L}; rounds {args.rounds}; "
        f"vanilla skipped where predicted > {args.max_point_seconds:.0f} s"
    )
    print(load_line("start", load_start))
    sys.stdout.flush()

    started = time.perf_counter()
    rng = np.random.default_rng(args.seed)
    # Enough tokens for the memory fill, the timed segments and the windows at the largest A.
    stream_length = (max(math.ceil(lengths[-1] / L), 1 + args.warmup) + args.rounds + 2) * L + 1
    tokens = rng.integers(0, args.model["vocabulary_size"], size=stream_length).astype("int32")

    check = None
    if not args.no_check:
        check = check_equal_predictions(args, lengths[0], tokens)
        print(
            f"check (1-layer model, A={check['attention_length']}): XL with memory vs vanilla window, log p of "
            f"tokens {check['positions']}: max |difference| {check['max_abs_difference']:.2e} "
            f"({'OK' if check['passed'] else 'MISMATCH'}, tolerance {CHECK_TOLERANCE:g})"
        )
        sys.stdout.flush()

    reference = None
    results = {}
    previous = None  # (A, median vanilla seconds) of the last A where vanilla ran
    for a in lengths:
        lm = build(args.model, a, args.seed, weights_from=reference)
        if reference is None:
            reference = lm
            count = sum(int(np.prod(v.shape)) for v in {id(v): v for v in lm.variables}.values())
            print(f"{count:,} parameters (the embedding tables tied with the softmax's)")
        stream = Stream(lm, tokens, L)
        fill = stream.fill_memory(at_least=1 + args.warmup)
        entry = results[str(a)] = {
            "xl_first_call_s": fill[0],
            "xl_fill_s": fill,
            "xl_segment_s": [],
            "vanilla_window_s": [],
        }
        run_vanilla = True
        if previous is not None:
            predicted = previous[1] * (a / previous[0]) ** 2 * (args.rounds + args.warmup + 1)
            if predicted > args.max_point_seconds:
                run_vanilla = False
                entry["vanilla_skipped"] = f"predicted {predicted:.0f} s > {args.max_point_seconds:.0f} s"
        if run_vanilla:
            entry["vanilla_first_call_s"] = stream.vanilla_window()[0]
            entry["vanilla_warmup_s"] = [stream.vanilla_window()[0] for _ in range(args.warmup)]
        print(
            f"[A={a}] first calls (compile): XL {entry['xl_first_call_s']:.2f} s, vanilla "
            + (f"{entry['vanilla_first_call_s']:.2f} s" if run_vanilla else "skipped")
        )
        sys.stdout.flush()
        for round_index in range(args.rounds):
            order = ("xl", "vanilla") if round_index % 2 == 0 else ("vanilla", "xl")
            for who in order:
                if who == "xl":
                    entry["xl_segment_s"].append(stream.xl_segment()[0])
                elif run_vanilla:
                    entry["vanilla_window_s"].append(stream.vanilla_window()[0])
        entry["xl_ms_per_token"] = statistics.median(entry["xl_segment_s"]) / L * 1e3
        line = (
            f"[A={a}] XL {entry['xl_ms_per_token']:.3f} ms/token (segment median "
            f"{statistics.median(entry['xl_segment_s']) * 1e3:.1f} ms / {L})"
        )
        if run_vanilla:
            vanilla_median = statistics.median(entry["vanilla_window_s"])
            entry["vanilla_ms_per_token"] = vanilla_median * 1e3
            entry["speedup"] = vanilla_median / (statistics.median(entry["xl_segment_s"]) / L)
            previous = (a, vanilla_median)
            line += f"; vanilla {entry['vanilla_ms_per_token']:.2f} ms/token; speedup {entry['speedup']:.0f}×"
        else:
            line += f"; vanilla skipped ({entry['vanilla_skipped']})"
        print(line)
        sys.stdout.flush()

    payload = {
        "backend": backend,
        "label": label,
        "cpu": cpu_model(),
        "logical_cores": os.cpu_count(),
        "threads": args.threads,
        "python": platform.python_version(),
        "versions": versions(backend),
        "model": dict(args.model, same_length=True, clamp_len=0, dropout=0.0),
        "attention_lengths": lengths,
        "segment_length": L,
        "rounds": args.rounds,
        "max_point_seconds": args.max_point_seconds,
        "check": check,
        "load_average_start": load_start,
        "load_average_end": load_average(),
        "elapsed_s": time.perf_counter() - started,
        "results": results,
    }
    print_table(payload)
    print(
        "\nSpeedup = vanilla ms/token / XL ms/token at equal attention length A (every query attends A keys in"
        "\nboth). With more than one layer XL's effective context is longer than A, so the two do not give the"
        "\nsame predictions; the 1-layer check above verifies that they do when the contexts coincide."
    )
    print(load_line("end", payload["load_average_end"]))
    print(f"elapsed: {payload['elapsed_s']:.0f} s")
    write_json(args.json, payload)
    return 0 if check is None or check["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
