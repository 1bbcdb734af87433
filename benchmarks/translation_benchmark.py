"""Times translation (beam search, beam 4, length penalty 0.6; and greedy)
with a Marian-shaped encoder-decoder (opus-mt-en-de's shape, random weights):
ours against Hugging Face transformers' ``MarianMTModel.generate``, in one
process, on the same source ids and the same weights.

The Keras backend is the one KERAS_BACKEND names; run the script once per
backend (``bash benchmarks/run.sh translation`` does all three).
transformers is a contender on torch only; on every backend its output is
the reference that ours is checked against (outside the timing). Nothing is
downloaded.

Model: a ``transformers.MarianMTModel`` of opus-mt-en-de's shape (vocab
58101, d_model 512, 6 encoder + 6 decoder layers, 8 heads, ffn 2048, swish,
scaled embeddings, 512 sinusoid positions, shared embeddings tied to the
output layer, ``final_logits_bias``; ``</s>`` = 0, ``<pad>`` = 58100 = the
decoder start), with random weights (``init_std`` 0.02, then every
trainable parameter moved by 0.1·N(0, 1), as the parity tests do, so that no bias is 0
and no norm the identity), saved with ``save_pretrained`` to a temporary
directory and loaded by ours with ``TransformerSeq2SeqLM.from_preset(dir,
preprocessor=None)`` (the Marian converter): both hold identical weights.

Inputs: no tokenizer. ``batch`` sources of random ids in [2, 58100) whose
lengths are drawn uniformly from [20, 40] (the last id ``</s>``, as Marian's
tokenizer ends a source), right-padded with ``<pad>``, with the attention /
padding mask. The same arrays go to every contender.

A fixed amount of work: random weights would stop at once (or never), so
every row decodes exactly ``max_length`` − 1 tokens (default 47): the end
token ``</s>`` is banned until the last position and forced there. All of
Marian's generation rules stay on (``</s>`` a stop token, ``<pad>``
suppressed, the forced end token):

* ``ours``: ``TransformerSeq2SeqLM.generate({"encoder_token_ids",
  "encoder_padding_mask"}, max_length=L, num_beams=4, length_penalty=0.6,
  early_stopping=False, stop_token_ids=[0], decoder_start_token_id=58100,
  suppressed_token_ids=[58100, 0], force_end_token=True)``; greedy:
  ``num_beams=1`` (sampler ``"greedy"``).
* ``ours_one_size_cache`` (not run unless named in ``--contenders``): ours
  with the decoder's key/value cache kept at the buffer's size, as before
  caches grew with the positions written (torch and JAX on a CPU,
  ``generation.cache_growth``); the same weights, in a model of its own.
* ``transformers`` (torch only): ``MarianMTModel`` in eval mode
  (``attn_implementation="sdpa"``), ``model.generate(input_ids,
  attention_mask=mask, max_length=L, min_length=L, num_beams=4,
  length_penalty=0.6, early_stopping=False, do_sample=False,
  bad_words_ids=[[58100]], eos_token_id=0, forced_eos_token_id=0,
  decoder_start_token_id=58100, pad_token_id=58100)`` under
  ``torch.no_grad()`` (``min_length`` bans ``</s>`` before the last
  position, where ``forced_eos_token_id`` forces it); greedy: ``num_beams=1``.

Checks, outside the timing: every call returns ``(batch, L)`` tokens, the
decoder start first, ``</s>`` last and nowhere else, no ``<pad>``; and ours
returns token for token the sequences transformers returns (computed once
per mode and batch size; a mismatch is reported and makes the exit status 1,
the timings are still taken: both did the same amount of decoding).

Reported per mode and batch size: the median and the minimum wall time of
one ``generate`` call (encoder pass included), sentences per second (batch
/ time), new tokens per second (batch × (L − 1) / time), the median process
CPU time, the first call's time (compilation / tracing), and the ratio
contender / ours of the times (> 1: ours faster): of the medians, of the
minima, and "paired", the median over rounds of each round's ratio. Each
contender is warmed up, then the ``--repeats`` timed calls are interleaved
round-robin, rotating who goes first.

Example::

    KERAS_BACKEND=torch python -m benchmarks.translation_benchmark --batch-sizes 16 --repeats 5
    KERAS_BACKEND=torch python -m benchmarks.translation_benchmark --tiny   # smoke test
"""

import argparse
import gc
import os
import sys
import tempfile
import time
import traceback

# Shared helpers (stdlib-only at import time, so they run before numpy/Keras).
from benchmarks.contenders import RATIO_NOTE
from benchmarks.contenders import record_failure
from benchmarks.contenders import ratio_cells
from benchmarks.contenders import select_contenders
from benchmarks.contenders import summarise
from benchmarks.contenders import time_interleaved
from benchmarks.contenders import timed_call
from benchmarks.contenders import with_setting
from benchmarks.timing import cpu_line
from benchmarks.timing import cpu_model
from benchmarks.timing import fmt_versions
from benchmarks.timing import load_average
from benchmarks.timing import load_line
from benchmarks.timing import start_backend
from benchmarks.timing import versions
from benchmarks.timing import write_json

# Helsinki-NLP/opus-mt-en-de's config.json (shape and generation ids).
OPUS_MT_EN_DE = dict(
    vocab_size=58101,
    d_model=512,
    encoder_layers=6,
    decoder_layers=6,
    encoder_attention_heads=8,
    decoder_attention_heads=8,
    encoder_ffn_dim=2048,
    decoder_ffn_dim=2048,
    max_position_embeddings=512,
    activation_function="swish",
    scale_embedding=True,
)
# A seconds-long smoke test of the script itself (--tiny); not a benchmark.
TINY = dict(
    OPUS_MT_EN_DE,
    vocab_size=1000,
    d_model=32,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=64,
    decoder_ffn_dim=64,
    max_position_embeddings=64,
)
EOS_ID = 0  # Marian's </s>; <pad> (the decoder start) is the last id.
CONTENDERS = ("ours", "ours_one_size_cache", "transformers")
DEFAULT_CONTENDERS = ("ours", "transformers")
MODES = ("beam", "greedy")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--batch-sizes", type=int, nargs="+", default=None, help="sentences per call (default 16; 4 with --tiny)"
    )
    parser.add_argument("--min-source-len", type=int, default=20, help="shortest source, </s> included")
    parser.add_argument("--max-source-len", type=int, default=40, help="longest source, </s> included")
    parser.add_argument(
        "--max-length", type=int, default=None,
        help="target length, decoder start included: every row decodes max_length - 1 tokens "
        "(default 48; 12 with --tiny)",
    )
    parser.add_argument("--num-beams", type=int, default=4)
    parser.add_argument("--length-penalty", type=float, default=0.6)
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of " + ",".join(MODES))
    parser.add_argument(
        "--repeats", type=int, default=None,
        help="timed calls per mode, batch size and contender (default 5; 2 with --tiny)",
    )
    parser.add_argument("--warmup", type=int, default=1, help="untimed calls (compilation) first")
    parser.add_argument(
        "--tiny", action="store_true", help="2+2 layers, 32 wide, vocab 1000: a smoke test of the script"
    )
    parser.add_argument(
        "--threads", type=int, default=os.cpu_count(),
        help="intra-op (and inter-op) threads, the same for every contender (default: all cores)",
    )
    parser.add_argument("--backend-label", default=None, help="label printed for this run (default: the Keras backend)")
    parser.add_argument(
        "--contenders", default=",".join(DEFAULT_CONTENDERS),
        help="comma-separated subset of " + ",".join(CONTENDERS) + " (default: " + ",".join(DEFAULT_CONTENDERS) + ")",
    )
    parser.add_argument(
        "--no-reference", action="store_true",
        help="on jax/tensorflow, skip transformers' reference output (and the equality check)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights and the sources")
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = parser.parse_args(argv)
    args.config = dict(TINY if args.tiny else OPUS_MT_EN_DE)
    if args.batch_sizes is None:
        args.batch_sizes = [4] if args.tiny else [16]
    if args.max_length is None:
        args.max_length = 12 if args.tiny else 48
    if args.repeats is None:
        args.repeats = 2 if args.tiny else 5
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if set(args.modes) - set(MODES):
        parser.error(f"unknown modes: {', '.join(sorted(set(args.modes) - set(MODES)))}")
    if not 2 <= args.min_source_len <= args.max_source_len <= args.config["max_position_embeddings"]:
        parser.error("need 2 <= --min-source-len <= --max-source-len <= max positions")
    if not 2 <= args.max_length <= args.config["max_position_embeddings"]:
        parser.error("--max-length must be in [2, max positions]")
    return args


def is_opus_mt_shape(config):
    return config == OPUS_MT_EN_DE


def make_sources(batch_size, config, min_len, max_len, seed=0):
    """`(token_ids, mask)` int32 `(batch, longest)`: random ids in
    [2, pad) ending with </s>, lengths uniform in [min_len, max_len],
    right-padded with <pad>."""
    import numpy as np

    pad_id = config["vocab_size"] - 1
    rng = np.random.default_rng(seed * 1000 + batch_size)
    lengths = rng.integers(min_len, max_len + 1, size=batch_size)
    token_ids = np.full((batch_size, int(lengths.max())), pad_id, dtype="int32")
    mask = np.zeros(token_ids.shape, dtype="int32")
    for row, length in enumerate(lengths):
        token_ids[row, : length - 1] = rng.integers(2, pad_id, size=length - 1)
        token_ids[row, length - 1] = EOS_ID
        mask[row, :length] = 1
    return token_ids, mask


def build_checkpoint(config, directory, seed):
    """A random-weight `MarianMTModel` saved to `directory`; returns the model
    (eval mode, sdpa attention)."""
    import torch
    import transformers

    transformers.utils.logging.disable_progress_bar()
    pad_id = config["vocab_size"] - 1
    hf_config = transformers.MarianConfig(
        **config,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        pad_token_id=pad_id,
        decoder_start_token_id=pad_id,
        eos_token_id=EOS_ID,
        forced_eos_token_id=EOS_ID,
        init_std=0.02,
        attn_implementation="sdpa",
    )
    torch.manual_seed(seed)
    model = transformers.MarianMTModel(hf_config).eval()
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.requires_grad:  # not the frozen sinusoid tables, which are not weights
                parameter.add_(0.1 * torch.randn(parameter.shape, generator=generator))
        model.final_logits_bias.add_(0.1 * torch.randn(model.final_logits_bias.shape, generator=generator))
    model.save_pretrained(directory)
    assert model.config._attn_implementation == "sdpa", model.config._attn_implementation
    return model


def transformers_generate_fn(model, config, mode, max_length, num_beams, length_penalty):
    import torch

    pad_id = config["vocab_size"] - 1
    options = dict(
        max_length=max_length,
        min_length=max_length,
        num_beams=num_beams if mode == "beam" else 1,
        do_sample=False,
        bad_words_ids=[[pad_id]],
        eos_token_id=EOS_ID,
        forced_eos_token_id=EOS_ID,
        decoder_start_token_id=pad_id,
        pad_token_id=pad_id,
    )
    if mode == "beam":
        options.update(length_penalty=length_penalty, early_stopping=False)

    def generate(token_ids, mask):
        with torch.no_grad():
            out = model.generate(
                input_ids=torch.from_numpy(token_ids).long(),
                attention_mask=torch.from_numpy(mask).long(),
                **options,
            )
        return out.numpy()

    call = "MarianMTModel.generate(" + ", ".join(f"{k}={v}" for k, v in options.items()) + ")"
    return generate, "eval + torch.no_grad() " + call + " (sdpa)"


def ours_generate_fn(mt, config, mode, max_length, num_beams, length_penalty):
    import numpy as np

    pad_id = config["vocab_size"] - 1
    options = dict(
        max_length=max_length,
        num_beams=num_beams if mode == "beam" else 1,
        stop_token_ids=[EOS_ID],
        decoder_start_token_id=pad_id,
        suppressed_token_ids=[pad_id, EOS_ID],
        force_end_token=True,
    )
    if mode == "beam":
        options.update(length_penalty=length_penalty, early_stopping=False)
    else:
        options.update(sampler="greedy")

    def generate(token_ids, mask):
        out = mt.generate({"encoder_token_ids": token_ids, "encoder_padding_mask": mask}, **options)
        ids, valid = np.asarray(out["token_ids"]), np.asarray(out["padding_mask"]).astype(bool)
        if not valid.all():
            raise AssertionError(f"ours returned {int((~valid).sum())} invalid positions (a row ended early)")
        return ids

    call = "TransformerSeq2SeqLM.generate(dict, " + ", ".join(f"{k}={v}" for k, v in options.items()) + ")"
    return generate, call


def with_one_size_cache(generate):
    """`generate` with the decoding cache kept at the buffer's size: the
    share of a step's traffic from which the cache grows made unreachable
    for the call (`backend_support.compiled_decoding`)."""
    from attention_zoo_keras.backend_support import compiled_decoding

    return with_setting(generate, compiled_decoding, "_GROWTH_PAYS_FROM_SHARE", float("inf"))


def check_output(name, token_ids, batch, max_length, pad_id):
    """Raises unless every row is the decoder start, max_length − 2 tokens
    other than </s> and <pad>, then </s>."""
    import numpy as np

    token_ids = np.asarray(token_ids)
    if token_ids.shape != (batch, max_length):
        raise AssertionError(f"{name} returned shape {token_ids.shape}, expected {(batch, max_length)}")
    body = token_ids[:, 1:-1]
    problems = []
    if (token_ids[:, 0] != pad_id).any():
        problems.append("a row does not start with the decoder start token")
    if (token_ids[:, -1] != EOS_ID).any():
        problems.append("a row does not end with </s>")
    if ((body == EOS_ID) | (body == pad_id)).any():
        problems.append("</s> or <pad> inside a row")
    if problems:
        raise AssertionError(f"{name}: " + "; ".join(problems))
    return batch * (max_length - 1)


def compare(ours, reference):
    """`{"equal", "rows_differing", "first_difference"}` of two `(batch, L)` arrays."""
    import numpy as np

    ours, reference = np.asarray(ours), np.asarray(reference)
    if ours.shape != reference.shape:
        return {"equal": False, "rows_differing": None, "shapes": [list(ours.shape), list(reference.shape)]}
    differ = (ours != reference).any(axis=1)
    first = {int(r): int(np.argmax(ours[r] != reference[r])) for r in np.nonzero(differ)[0]}
    return {"equal": not differ.any(), "rows_differing": int(differ.sum()), "first_difference": first}


# --------------------------------------------------------------------------- main


def main(argv=None):
    args = parse_args(argv)
    backend, _ = start_backend(args.threads)
    label = args.backend_label or backend
    contenders = select_contenders(args.contenders, CONTENDERS)
    if backend != "torch" and "transformers" in contenders:
        contenders.remove("transformers")
    config, max_length = args.config, args.max_length
    pad_id = config["vocab_size"] - 1
    new_tokens = max_length - 1
    want_reference = "transformers" in contenders or not args.no_reference

    shape_name = "opus-mt-en-de shape" if is_opus_mt_shape(config) else "custom shape (NOT opus-mt-en-de's)"
    load_start = load_average()
    print(f"# Marian ({shape_name}) translation benchmark, backend={label}")
    print("model: " + ", ".join(f"{k} {v}" for k, v in config.items()) + "; dropout 0, random weights")
    print(cpu_line(args.threads, per_library=True))
    print(fmt_versions(versions(backend)))
    print(
        f"sources: random ids, lengths uniform in [{args.min_source_len}, {args.max_source_len}] (</s> included), "
        f"right-padded; batch sizes {', '.join(map(str, args.batch_sizes))}; max_length {max_length} "
        f"({new_tokens} decoded tokens per row, </s> forced last); modes {', '.join(args.modes)} "
        f"(beam: {args.num_beams} beams, length_penalty {args.length_penalty}); warmup {args.warmup}, "
        f"repeats {args.repeats} (median reported)"
    )
    print(load_line("start", load_start))
    sys.stdout.flush()

    from attention_zoo_keras.models.transformer import TransformerSeq2SeqLM

    results = {}  # contender -> {"path": {mode: str}, "<mode>_batch_<b>": {...}} or {"error": str}
    runners = {}  # contender -> {mode: generate(token_ids, mask) -> numpy (batch, L)}
    comparisons = {}  # "<mode>_batch_<b>" -> compare(ours, transformers)

    def fail(name, error):
        record_failure(results[name], error, f"[{name}]")
        runners.pop(name, None)

    with tempfile.TemporaryDirectory(prefix="marian_bench_") as directory:
        start = time.perf_counter()
        hf_model = build_checkpoint(config, directory, args.seed)
        hf_params = sum(p.numel() for p in hf_model.parameters())
        build_s = time.perf_counter() - start
        print(f"[checkpoint] MarianMTModel {hf_params:,} parameters, built and saved in {build_s:.1f}s")
        reference = {
            mode: transformers_generate_fn(hf_model, config, mode, max_length, args.num_beams, args.length_penalty)
            for mode in args.modes
        }
        if "transformers" in contenders:
            results["transformers"] = {
                "params": int(hf_params), "build_s": build_s, "path": {m: reference[m][1] for m in args.modes}
            }
            runners["transformers"] = {m: reference[m][0] for m in args.modes}
        if "ours" in contenders:
            results["ours"] = {}
            try:
                start = time.perf_counter()
                mt = TransformerSeq2SeqLM.from_preset(directory, preprocessor=None)
                build_s = time.perf_counter() - start
                fns = {
                    m: ours_generate_fn(mt, config, m, max_length, args.num_beams, args.length_penalty)
                    for m in args.modes
                }
                results["ours"].update(
                    params=int(mt.count_params()), build_s=build_s, path={m: fns[m][1] for m in args.modes}
                )
                runners["ours"] = {m: fns[m][0] for m in args.modes}
                print(f"[ours] {mt.count_params():,} parameters, from_preset in {build_s:.1f}s")
                if "ours_one_size_cache" in contenders:
                    # A model of its own: under JAX and TensorFlow a model keeps its compiled program.
                    one_size = TransformerSeq2SeqLM.from_preset(directory, preprocessor=None)
                    one_size_fns = {
                        m: ours_generate_fn(one_size, config, m, max_length, args.num_beams, args.length_penalty)
                        for m in args.modes
                    }
                    results["ours_one_size_cache"] = {"path": {m: fns[m][1] + ", one-size cache" for m in args.modes}}
                    runners["ours_one_size_cache"] = {m: with_one_size_cache(one_size_fns[m][0]) for m in args.modes}
            except Exception as error:
                fail("ours", error)
    for name in runners:
        for mode in args.modes:
            print(f"[{name}] {mode}: {results[name]['path'][mode]}")
    sys.stdout.flush()

    for mode in args.modes:
        for batch_size in args.batch_sizes:
            key = f"{mode}_batch_{batch_size}"
            token_ids, mask = make_sources(batch_size, config, args.min_source_len, args.max_source_len, args.seed)
            print(f"\n## {mode}, batch {batch_size} (source lengths {', '.join(map(str, mask.sum(axis=1)))})")

            def run_once(name):
                out = runners[name][mode](token_ids, mask)
                check_output(name, out, batch_size, max_length, pad_id)
                return out

            expected = None
            if want_reference:
                if "transformers" in runners:
                    start = time.perf_counter()
                    try:
                        expected = run_once("transformers")
                    except Exception as error:
                        fail("transformers", error)
                    first = time.perf_counter() - start
                    if "transformers" in runners:
                        results["transformers"][key] = {"first_call_s": first, "times_s": [], "cpu_s": []}
                        print(f"[transformers] first call {first:.2f}s")
                else:
                    try:
                        expected = reference[mode][0](token_ids, mask)
                        check_output("transformers (reference)", expected, batch_size, max_length, pad_id)
                    except Exception:
                        expected = None
                        print(f"[transformers (reference)] FAILED, no equality check:\n{traceback.format_exc()}")
            for name in [name for name in ("ours", "ours_one_size_cache") if name in runners]:
                try:
                    start = time.perf_counter()
                    out = run_once(name)
                    first = time.perf_counter() - start
                    results[name][key] = {"first_call_s": first, "times_s": [], "cpu_s": []}
                    line = f"[{name}] first call (compile/trace) {first:.2f}s"
                    if expected is not None:
                        comparison = compare(out, expected)
                        if key not in comparisons or not comparison["equal"]:  # a mismatch of either is kept
                            comparisons[key] = comparison
                        if comparison["equal"]:
                            line += f"; same {batch_size} x {max_length} tokens as transformers"
                        else:
                            line += f"; MISMATCH with transformers: {comparison}"
                    print(line)
                except Exception as error:
                    fail(name, error)
            for name in list(runners):
                for _ in range(args.warmup - 1):
                    try:
                        run_once(name)
                    except Exception as error:
                        fail(name, error)
            sys.stdout.flush()

            time_interleaved(
                runners, args.repeats, lambda name: timed_call(lambda: run_once(name))[1:],
                lambda name: results[name][key], fail,
            )
            for name in runners:
                entry = results[name][key]
                summarise(entry)
                entry["sentences_per_s_median"] = batch_size / entry["median_s"]
                entry["sentences_per_s_best"] = batch_size / entry["min_s"]
                entry["new_tokens_per_s_median"] = batch_size * new_tokens / entry["median_s"]
                print(
                    f"[{name}] {mode} batch {batch_size}: median {entry['median_s']:.3f} s "
                    f"({entry['sentences_per_s_median']:.2f} sentences/s, {entry['new_tokens_per_s_median']:.1f} "
                    f"new tok/s), min {entry['min_s']:.3f} s, median process CPU {entry['cpu_median_s']:.3f} s "
                    f"over {len(entry['times_s'])}; all: {', '.join(f'{t:.3f}' for t in entry['times_s'])}"
                )
            sys.stdout.flush()
            gc.collect()
    runners.clear()

    print(
        f"\n## {label}: Marian ({shape_name}), sources {args.min_source_len}-{args.max_source_len} tokens, "
        f"{new_tokens} decoded tokens per row, median of {args.repeats} (seconds per generate call)\n"
    )
    print(
        "| mode | batch | contender | median s | min s | CPU s | sentences/s (median) | sentences/s (best) "
        "| new tok/s | same output | ratio (median) | ratio (min) | ratio (paired) |"
    )
    print("|" + "---|" * 13)
    ours = results.get("ours", {})
    for mode in args.modes:
        for batch_size in args.batch_sizes:
            key = f"{mode}_batch_{batch_size}"
            same = comparisons.get(key)
            same_cell = "-" if same is None else ("yes" if same["equal"] else f"NO ({same['rows_differing']} rows)")
            for name, entry in results.items():
                if "error" in entry or "median_s" not in entry.get(key, {}):
                    print(f"| {mode} | {batch_size} | {name} | failed |" + " - |" * 9)
                    continue
                e = entry[key]
                cells = [f"{e['median_s']:.3f}", f"{e['min_s']:.3f}", f"{e['cpu_median_s']:.3f}"]
                cells += [f"{e['sentences_per_s_median']:.2f}", f"{e['sentences_per_s_best']:.2f}"]
                cells += [f"{e['new_tokens_per_s_median']:.1f}", same_cell]
                cells += ratio_cells(e, None if "error" in ours else ours.get(key))
                print(f"| {mode} | {batch_size} | {name} | " + " | ".join(cells) + " |")
    print(
        "\nsentences/s = batch / wall time of one generate call (encoder pass included); new tok/s = batch x"
        f"\n{new_tokens} / that time. same output: ours returned transformers' sequences token for token."
        + RATIO_NOTE
        + ")."
    )
    load_end = load_average()
    print(load_line("end", load_end))

    if args.json:
        payload = {
            "backend": backend,
            "label": label,
            "cpu": cpu_model(),
            "threads": args.threads,
            "versions": versions(backend),
            "model": config,
            "opus_mt_shape": is_opus_mt_shape(config),
            "batch_sizes": args.batch_sizes,
            "source_lengths": [args.min_source_len, args.max_source_len],
            "max_length": max_length,
            "new_tokens_per_row": new_tokens,
            "num_beams": args.num_beams,
            "length_penalty": args.length_penalty,
            "modes": args.modes,
            "repeats": args.repeats,
            "warmup": args.warmup,
            "load_average_start": load_start,
            "load_average_end": load_end,
            "same_output_as_transformers": comparisons,
            "results": results,
        }
        write_json(args.json, payload)
    failed = [name for name, entry in results.items() if "error" in entry]
    mismatched = [key for key, c in comparisons.items() if not c["equal"]]
    if mismatched:
        print(f"MISMATCH between ours and transformers in: {', '.join(mismatched)}")
    return 1 if failed or mismatched else 0


if __name__ == "__main__":
    sys.exit(main())
