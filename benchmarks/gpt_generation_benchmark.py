"""Times greedy generation with a GPT-2-small-shaped model: ours against
KerasHub's (and, on torch, Hugging Face transformers'), in one process, on the
same prompts.

The Keras backend is the one KERAS_BACKEND names; run the script once per
backend (``bash benchmarks/run.sh gpt_generation`` does all three). Weights
are random: nothing is downloaded. On torch, ``--device`` picks the device
(``auto``: CUDA when torch sees a GPU, else the CPU): Keras is pointed at it
with ``KERAS_TORCH_DEVICE`` and the transformers models are moved there. JAX
and TensorFlow run on their default device (printed in the header).
``--dtype bfloat16`` makes every contender compute in bfloat16: the Keras
backbones are built with ``dtype="bfloat16"``, the transformers models are
``.to(torch.bfloat16)``.

Contenders (all GPT-2 small: vocab 50257, 12 layers, 12 heads, hidden 768,
intermediate 3072, 1024 positions, GELU (tanh), dropout 0):

* ``ours``: ``attention_zoo_keras.models.GPTCausalLM(GPTBackbone(...),
  preprocessor=None)``, called as ``lm.generate({"token_ids": ids,
  "padding_mask": ones}, max_new_tokens=N, stop_token_ids=None)`` with the
  ``(batch, prompt_len)`` int32 prompts as numpy arrays (what ``generate``
  takes: it copies them to the device itself, inside the timing).
* ``ours_compiled``: the same after ``lm.compile(jit_compile=True)``: on
  torch the decoding step is recorded with ``make_fx`` and compiled by
  inductor (on CUDA then captured as a CUDA graph, as ``ours`` is).
* ``ours_tested_every_step``, ``ours_one_row_products`` and
  ``ours_mask_only`` (not run unless named in ``--contenders``): ``ours``
  without one of its GPU optimisations (``OURS_WITHOUT``), each measured
  against ``ours`` in one process: the decoding loop testing its stop
  condition at every step (``backend_support.compiled_decoding``; on a GPU
  it tests every 8 steps); under JAX, a single row's projections left to
  XLA (``backend_support.dense_kernels``; on a GPU one row is multiplied as
  two); under JAX, cuDNN's attention given the mask alone
  (``backend_support.attention_kernels``; on a GPU it is also given each
  row's key length, so it skips the cache not yet written).
* ``keras_hub``: ``keras_hub.models.GPT2CausalLM(GPT2Backbone(...),
  preprocessor=None)``, compiled with ``sampler="greedy"``, called as
  ``model.generate({"token_ids": ids, "padding_mask": mask},
  stop_token_ids=None)``. Without a preprocessor KerasHub's ``generate``
  ignores ``max_length``: it decodes until the end of the buffer it is given,
  so the prompts are right-padded with zeros to ``prompt_len + N`` and the
  mask is true on the prompt only (made backend tensors before the clock
  starts). Its greedy loop (``Sampler.__call__``) runs from the shortest
  prompt's length to the buffer's end, writing one position per step where
  the mask is false: N new tokens per row.
* ``transformers`` (torch backend only): ``transformers.GPT2LMHeadModel``
  (``attn_implementation="sdpa"``) in eval mode, ``model.generate(input_ids,
  attention_mask=ones, max_new_tokens=N, min_new_tokens=N, do_sample=False,
  num_beams=1, pad_token_id=0)`` under ``torch.no_grad()``, the int64
  prompts and mask already on the device (``min_new_tokens`` masks the
  end-of-text token, so no row ends early).
* ``transformers_static`` (torch only): the same with
  ``cache_implementation="static"`` and ``max_cache_len=prompt_len + N``, a
  cache preallocated to the same full length for every batch size. On a GPU
  this is transformers' best generation path: ``generate`` then compiles the
  decoding step by itself (``_valid_auto_compile_criteria``: the model is on
  CUDA and the cache is a static one; no ``compile_config`` is needed, the
  default ``CompileConfig`` is ``torch.compile`` with inductor, mode
  ``"reduce-overhead"`` (CUDA graphs) and automatic dynamic shapes, so the
  first batch size compiles and each later one recompiles or records anew,
  in its first call). On the CPU it runs eagerly.

Every call's output goes back to the host as numpy (ours and KerasHub's
``generate`` return numpy; transformers' ids are copied with ``.cpu()``),
and on CUDA the device is synchronized (``torch.cuda.synchronize()``) before
each clock starts and after each call. After each call, outside the timing,
the output is checked: the prompts came back unchanged and exactly
``batch * N`` new tokens were generated (the count is printed). Once per
batch size, the continuation is also checked to be greedy: one full forward
over the returned sequence must give every generated token the largest logit
at the position before it (within 1e-3, for near-ties between the cached and
the full computation). In bfloat16 the cached and the full computation round
differently, so there the tokens that fail are counted and reported instead
of failing the run.

Reported per batch size: the first call's time (compilation, recording,
warm-up), the median and the minimum wall time of one ``generate`` call
(``time.perf_counter``), new tokens per second (``batch * N / time``), the
median process CPU time (on CUDA it includes the host's wait for the
device), and the ratio other / ours of the times (above 1 meaning ours is
faster): of the medians, of the minima, and "paired", the median over rounds
of each round's ratio, the one to trust on a busy machine; and the achieved
memory bandwidth of decoding, the bytes a decoding step reads
(``decoding_bytes_per_step``) over the time per step (the median time / N),
in GB/s and as a share of the device's peak (``timing.PEAK_RATES``, or
``--peak-bandwidth-gbs``). The contenders are
built once; for each batch size each is warmed up, then the ``--repeats``
timed calls are interleaved round-robin (rotating who goes first) so that
other load on the machine weighs on every contender alike.

Example::

    KERAS_BACKEND=jax python -m benchmarks.gpt_generation_benchmark --batch-sizes 1 8
    KERAS_BACKEND=torch python -m benchmarks.gpt_generation_benchmark --tiny   # smoke test
    KERAS_BACKEND=torch python -m benchmarks.gpt_generation_benchmark --dtype bfloat16 --batch-sizes 1 8 32 \\
        --contenders ours,transformers,transformers_static   # on a GPU
"""

import argparse
import gc
import os
import sys
import time

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
from benchmarks.timing import device_description
from benchmarks.timing import device_synchronizer
from benchmarks.timing import fmt_percent
from benchmarks.timing import fmt_versions
from benchmarks.timing import load_average
from benchmarks.timing import load_line
from benchmarks.timing import peak_rates
from benchmarks.timing import start_backend
from benchmarks.timing import versions
from benchmarks.timing import write_json

GPT2_SMALL = dict(
    vocabulary_size=50257,
    num_layers=12,
    num_heads=12,
    hidden_dim=768,
    intermediate_dim=3072,
    max_sequence_length=1024,
)
# A few-second smoke test of the script itself (--tiny); not a benchmark.
TINY = dict(GPT2_SMALL, vocabulary_size=1000, num_layers=2, num_heads=2, hidden_dim=64, intermediate_dim=128)
TINY_NEW_TOKENS = 8
CONTENDERS = ("ours", "ours_compiled", "ours_tested_every_step", "ours_one_row_products", "ours_mask_only", "keras_hub",
              "transformers", "transformers_static")
DEFAULT_CONTENDERS = ("ours", "ours_compiled", "keras_hub", "transformers", "transformers_static")
# A generated token passes the greedy check if its logit is within this of the
# row's largest (relative to the largest's magnitude, floored at 1).
GREEDY_TOLERANCE = 1e-3
BYTES_PER_ELEMENT = {"float32": 4, "bfloat16": 2}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument(
        "--new-tokens", type=int, default=None, help="tokens generated per row (default 128; 8 with --tiny)"
    )
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per batch size and contender")
    parser.add_argument("--warmup", type=int, default=1, help="untimed calls (compilation) first")
    shape = parser.add_argument_group("model shape (default GPT-2 small; each overrides --tiny too)")
    shape.add_argument("--num-layers", type=int, default=None)
    shape.add_argument("--hidden-dim", type=int, default=None)
    shape.add_argument("--num-heads", type=int, default=None)
    shape.add_argument("--intermediate-dim", type=int, default=None)
    shape.add_argument("--vocab-size", type=int, default=None)
    shape.add_argument("--max-sequence-length", type=int, default=None, help="learned positions (default 1024)")
    parser.add_argument("--tiny", action="store_true", help="2-layer, 64-wide, 1000-token smoke test of the script")
    parser.add_argument(
        "--threads", type=int, default=os.cpu_count(),
        help="intra-op (and inter-op) threads, the same for every contender (default: all cores)",
    )
    parser.add_argument(
        "--backend-label", default=None,
        help="label printed for this run (default: the Keras backend's name)",
    )
    parser.add_argument(
        "--device", default="auto", choices=["auto", "cpu", "cuda"],
        help="torch backend: where Keras and transformers run (auto: cuda when torch sees a GPU, else cpu); "
        "JAX and TensorFlow take only auto (their default device)",
    )
    parser.add_argument(
        "--dtype", default="float32", choices=["float32", "bfloat16"], help="what every contender computes in"
    )
    parser.add_argument(
        "--jit-compile", default="auto", choices=["auto", "true", "false"],
        help="`jit_compile` given to KerasHub's compile(); it decides whether its TensorFlow generate "
        "loop is XLA-compiled ('auto' resolves to False on a CPU-only machine). Ours always compiles "
        "its loop with XLA on TensorFlow.",
    )
    parser.add_argument(
        "--contenders", default=",".join(DEFAULT_CONTENDERS), help="comma-separated subset of " + ",".join(CONTENDERS)
    )
    parser.add_argument("--no-greedy-check", action="store_true", help="skip the full-forward greedy check")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights and the prompts")
    parser.add_argument(
        "--peak-bandwidth-gbs", type=float, default=None,
        help="peak memory bandwidth (GB/s) the bandwidth share divides by, instead of the device's in "
        "timing.PEAK_RATES (without either, as on CPUs, it is '-')",
    )
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = parser.parse_args(argv)
    config = dict(TINY if args.tiny else GPT2_SMALL)
    overrides = {
        "num_layers": args.num_layers,
        "hidden_dim": args.hidden_dim,
        "num_heads": args.num_heads,
        "intermediate_dim": args.intermediate_dim,
        "vocabulary_size": args.vocab_size,
        "max_sequence_length": args.max_sequence_length,
    }
    config.update({key: value for key, value in overrides.items() if value is not None})
    args.config = config
    if args.new_tokens is None:
        args.new_tokens = TINY_NEW_TOKENS if args.tiny else 128
    if args.prompt_len < 1 or args.new_tokens < 1:
        parser.error("--prompt-len and --new-tokens must be at least 1")
    if args.prompt_len + args.new_tokens > config["max_sequence_length"]:
        parser.error(
            f"--prompt-len + --new-tokens ({args.prompt_len + args.new_tokens}) exceeds "
            f"max_sequence_length {config['max_sequence_length']}"
        )
    if config["hidden_dim"] % config["num_heads"]:
        parser.error(f"--hidden-dim {config['hidden_dim']} is not a multiple of --num-heads {config['num_heads']}")
    return args


def is_gpt2_small(config):
    return config == GPT2_SMALL


def decoding_bytes_per_step(params, config, batch_size, prompt_len, new_tokens, dtype):
    """Bytes one decoding step reads: every weight once (`params` elements,
    the token embedding included, which the tied LM head reads each step;
    the position table is counted whole, though a step reads one row of it)
    plus the key/value cache that attention reads, 2 * num_layers * batch *
    attended length * hidden_dim elements, at the average attended length
    over the new tokens, prompt_len + new_tokens / 2; elements of `dtype`.
    A cache read to its full preallocated length (as a static cache may be)
    reads more than this."""
    cache = 2 * config["num_layers"] * batch_size * (prompt_len + new_tokens / 2) * config["hidden_dim"]
    return (params + cache) * BYTES_PER_ELEMENT[dtype]


def peak_bandwidth(args, description):
    """`(bytes/s, where it comes from)`: `--peak-bandwidth-gbs` where given,
    else the `PEAK_RATES` entry of the device (`description`), else
    `(None, ...)` (CPUs)."""
    if args.peak_bandwidth_gbs is not None:
        return args.peak_bandwidth_gbs * 1e9, "--peak-bandwidth-gbs"
    rates = peak_rates(description)
    if rates is None:
        return None, "no peak known for this device; --peak-bandwidth-gbs sets one"
    return rates["bandwidth"], "the device's in timing.PEAK_RATES"


def make_prompts(batch_size, prompt_len, vocabulary_size, seed=0):
    """`(batch, prompt_len)` int32 random ids in [1, vocab − 1) (no pad id 0,
    no end-of-text id vocab − 1), all rows full length."""
    import numpy as np

    rng = np.random.default_rng(seed + batch_size)
    return rng.integers(1, vocabulary_size - 1, size=(batch_size, prompt_len)).astype("int32")


def count_new_tokens(token_ids, valid, prompts):
    """Checks that the output starts with the prompts; the number of valid
    positions past them."""
    import numpy as np

    token_ids, valid = np.asarray(token_ids), np.asarray(valid).astype(bool)
    batch, prompt_len = prompts.shape
    assert token_ids.shape[0] == batch and token_ids.shape == valid.shape, (token_ids.shape, valid.shape)
    assert (token_ids[:, :prompt_len] == prompts).all(), "the prompts did not come back unchanged"
    assert valid[:, :prompt_len].all(), "prompt positions marked invalid"
    return int(valid[:, prompt_len:].sum())


# --------------------------------------------------------------------------- contenders
# Each builder returns (model, prepare(prompts) -> what generate takes, made
# before the clock starts, generate(prepared) -> (token_ids, valid) numpy,
# logits(token_ids) -> numpy (batch, length, vocab), path description).


def build_ours(config, new_tokens, dtype, jit_compile=False):
    import keras
    import numpy as np

    from attention_zoo_keras.models import GPTBackbone
    from attention_zoo_keras.models import GPTCausalLM

    backbone = GPTBackbone(**config, dropout=0.0, attention_dropout=0.0, dtype=dtype)
    lm = GPTCausalLM(backbone=backbone, preprocessor=None)
    if jit_compile:
        lm.compile(jit_compile=True)

    def prepare(prompts):
        return {"token_ids": prompts, "padding_mask": np.ones_like(prompts)}

    def generate(inputs):
        out = lm.generate(inputs, max_new_tokens=new_tokens, stop_token_ids=None)
        return out["token_ids"], out["padding_mask"]

    def logits(token_ids):
        ones = np.ones_like(token_ids)
        return keras.ops.convert_to_numpy(lm({"token_ids": token_ids, "padding_mask": ones}))

    path = "GPTCausalLM.generate(dict of numpy, max_new_tokens, stop_token_ids=None) (default sampler 'greedy')"
    if jit_compile:
        path += ", after compile(jit_compile=True) (torch: the decoding step compiled by inductor)"
    return lm, prepare, generate, logits, path


# Variants of ours that undo one optimisation, each measured against ours in
# the same process: contender -> (module of the library, its setting, the
# value that undoes it, what the path says).
OURS_WITHOUT = {
    "ours_tested_every_step": (
        "attention_zoo_keras.backend_support.compiled_decoding", "_STEPS_BETWEEN_TESTS_ON_GPU", 1,
        "the stop condition tested at every step",
    ),
    "ours_one_row_products": (
        "attention_zoo_keras.backend_support.dense_kernels", "_SINGLE_ROWS_AS_TWO_ON_GPU", False,
        "a single row's projections left to XLA as vector-by-matrix products",
    ),
    "ours_mask_only": (
        "attention_zoo_keras.backend_support.attention_kernels", "_KEY_LENGTHS_FOR_CUDNN", False,
        "cuDNN's attention given the mask alone, without each row's key length",
    ),
}


def without_optimisation(name, generate):
    """`generate` with the setting `OURS_WITHOUT[name]` names changed during
    each call (and so in what the call traces)."""
    import importlib

    module_name, setting, value, _ = OURS_WITHOUT[name]
    return with_setting(generate, importlib.import_module(module_name), setting, value)


def build_keras_hub(config, new_tokens, jit_compile, dtype):
    import keras
    import keras_hub
    import numpy as np

    backbone = keras_hub.models.GPT2Backbone(**config, dropout=0.0, dtype=dtype)
    lm = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
    jit = {"auto": "auto", "true": True, "false": False}[jit_compile]
    lm.compile(sampler="greedy", jit_compile=jit)
    assert type(lm.sampler).__name__ == "GreedySampler", lm.sampler

    def prepare(prompts):
        # preprocessor=None: KerasHub 0.32's CausalLM.generate(inputs,
        # max_length=None, stop_token_ids="auto", strip_prompt=False) uses
        # `max_length` only for its preprocessor; the buffer's width decides.
        # GreedySampler.__call__ loops from index = min(prompt lengths) with
        # maximum_iterations = width - index, writing position `index` where
        # padding_mask is false, so padding every row to prompt_len +
        # new_tokens (mask true on the prompt) gives exactly new_tokens new
        # tokens per row (verified: with stop_token_ids=None the returned
        # padding_mask is all ones, so the count in run_once is new_tokens by
        # construction; the greedy check is what shows that each of those
        # positions was really written with the argmax, not left at pad 0).
        batch, prompt_len = prompts.shape
        token_ids = np.zeros((batch, prompt_len + new_tokens), dtype="int32")
        token_ids[:, :prompt_len] = prompts
        padding_mask = np.zeros(token_ids.shape, dtype=bool)
        padding_mask[:, :prompt_len] = True
        return {
            "token_ids": keras.ops.convert_to_tensor(token_ids),
            "padding_mask": keras.ops.convert_to_tensor(padding_mask),
        }

    def generate(inputs):
        out = lm.generate(inputs, stop_token_ids=None)
        return out["token_ids"], out["padding_mask"]

    def logits(token_ids):
        ones = np.ones_like(token_ids)
        return keras.ops.convert_to_numpy(lm({"token_ids": token_ids, "padding_mask": ones}))

    compiled = {
        "jax": "jax.jit",
        "tensorflow": f"tf.function(jit_compile={lm.jit_compile})",
        "torch": "eager, torch.no_grad()",
    }.get(keras.backend.backend(), "?")
    path = f"GPT2CausalLM.generate(dict padded to prompt+new, stop_token_ids=None), GreedySampler, {compiled}"
    return lm, prepare, generate, logits, path


def transformers_gpt2(config):
    """`transformers.GPT2LMHeadModel` of the shape `config` names (random
    weights, dropout 0, GELU (tanh), sdpa attention)."""
    import transformers

    hf_config = transformers.GPT2Config(
        vocab_size=config["vocabulary_size"],
        n_positions=config["max_sequence_length"],
        n_embd=config["hidden_dim"],
        n_layer=config["num_layers"],
        n_head=config["num_heads"],
        n_inner=config["intermediate_dim"],
        activation_function="gelu_new",
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        # GPT-2's <|endoftext|> is the last id; kept inside the vocabulary
        # when a smaller one is benchmarked.
        bos_token_id=config["vocabulary_size"] - 1,
        eos_token_id=config["vocabulary_size"] - 1,
        attn_implementation="sdpa",
    )
    model = transformers.GPT2LMHeadModel(hf_config)
    assert model.config._attn_implementation == "sdpa", model.config._attn_implementation
    return model


def build_transformers(config, prompt_len, new_tokens, dtype, device, static_cache=False):
    """`transformers`' GPT-2 on `device` in `dtype` and its greedy
    `generate`; with `static_cache`, `cache_implementation="static"` (a
    cache preallocated to `prompt_len + new_tokens`, for which `generate`
    compiles the decoding step on CUDA: its best generation path)."""
    import torch

    model = transformers_gpt2(config)
    model.to(device=device, dtype=getattr(torch, dtype)).eval()
    cache = {"cache_implementation": "static", "max_cache_len": prompt_len + new_tokens} if static_cache else {}

    def prepare(prompts):
        input_ids = torch.from_numpy(prompts).long().to(device)
        return input_ids, torch.ones_like(input_ids)

    def generate(inputs):
        input_ids, attention_mask = inputs
        with torch.no_grad():
            out = model.generate(
                input_ids,
                attention_mask=attention_mask,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=False,
                num_beams=1,
                pad_token_id=0,
                **cache,
            )
        out = out.cpu().numpy()
        # No row can end early (min_new_tokens), so every position is valid.
        return out, out >= 0

    def logits(token_ids):
        with torch.no_grad():
            return model(torch.from_numpy(token_ids).long().to(device)).logits.float().cpu().numpy()

    path = f"eval + torch.no_grad() GPT2LMHeadModel.generate(greedy, min_new_tokens=max_new_tokens) (sdpa, {dtype})"
    if static_cache:
        path += f', cache_implementation="static", max_cache_len={prompt_len + new_tokens}'
        if device == "cuda":
            path += " (decoding step compiled by generate: torch.compile, reduce-overhead)"
    return model, prepare, generate, logits, path


def greedy_check(logits_fn, token_ids, prompt_len):
    """`(checked, mismatches, worst gap)`: each generated token against the
    logits of one full forward over the whole output at the position before
    it."""
    import numpy as np

    token_ids = np.asarray(token_ids).astype("int32")
    logits = np.asarray(logits_fn(token_ids), dtype="float32")[:, prompt_len - 1 : -1]
    chosen = np.take_along_axis(logits, token_ids[:, prompt_len:, None].astype("int64"), axis=-1)[..., 0]
    best = logits.max(axis=-1)
    gap = best - chosen
    bad = gap > GREEDY_TOLERANCE * np.maximum(1.0, np.abs(best))
    return int(gap.size), int(bad.sum()), float(gap.max())


# --------------------------------------------------------------------------- main


def main(argv=None):
    args = parse_args(argv)
    backend, device = start_backend(args.threads, args.device)

    import keras

    label = args.backend_label or backend
    contenders = select_contenders(args.contenders, CONTENDERS)
    if backend != "torch":
        contenders = [name for name in contenders if not name.startswith("transformers")]
    config, new_tokens, prompt_len = args.config, args.new_tokens, args.prompt_len
    synchronize = device_synchronizer(backend, device)
    # bfloat16 rounds the cached and the full forward differently: near-ties
    # may pick other tokens, counted rather than fatal.
    mismatches_allowed = args.dtype == "bfloat16"

    shape_name = "GPT-2 small" if is_gpt2_small(config) else "custom shape (NOT GPT-2 small)"
    print(f"# {shape_name} greedy generation benchmark, backend={label}, {args.dtype}")
    print(
        "model: " + ", ".join(f"{k} {v}" for k, v in config.items()) + "; dropout 0, random weights"
    )
    description = device_description(backend, device)
    peak, peak_source = peak_bandwidth(args, description)
    print(f"device: {description}")
    print(f"peak memory bandwidth: {f'{peak / 1e9:g} GB/s' if peak else '-'} ({peak_source})")
    print(cpu_line(args.threads, per_library=True))
    print(fmt_versions(versions(backend)))
    print(
        f"prompt {prompt_len} tokens (random ids, no padding), {new_tokens} new tokens per row, "
        f"batch sizes {', '.join(map(str, args.batch_sizes))}; warmup {args.warmup}, repeats {args.repeats} "
        f"(median reported)"
    )
    print(load_line("start"))
    sys.stdout.flush()

    results = {}  # contender -> {"path": str, "batch_<b>": {...}} or {"error": str}
    runners = {}  # contender -> (prepare, generate, logits)

    def fail(name, error):
        record_failure(results[name], error, f"[{name}]")
        runners.pop(name, None)

    # Build every contender first, then time them interleaved (round-robin,
    # rotating who goes first) per batch size.
    for name in contenders:
        results[name] = {}
        try:
            keras.utils.set_random_seed(args.seed)
            start = time.perf_counter()
            if name.startswith("transformers"):
                static = name == "transformers_static"
                model, *runner, path = build_transformers(config, prompt_len, new_tokens, args.dtype, device, static)
                params = sum(p.numel() for p in model.parameters())
            elif name == "keras_hub":
                model, *runner, path = build_keras_hub(config, new_tokens, args.jit_compile, args.dtype)
                params = model.count_params()
            else:
                model, *runner, path = build_ours(config, new_tokens, args.dtype, name == "ours_compiled")
                if name in OURS_WITHOUT:
                    runner[1] = without_optimisation(name, runner[1])
                    path += ", " + OURS_WITHOUT[name][3]
                params = model.count_params()
            synchronize()
            results[name].update(build_s=time.perf_counter() - start, path=path, params=int(params))
            runners[name] = runner
            print(f"[{name}] {params:,} parameters, built in {results[name]['build_s']:.1f}s; {path}")
            sys.stdout.flush()
        except Exception as error:  # report and go on with the other contenders
            fail(name, error)
        model = runner = None
        gc.collect()

    for batch_size in args.batch_sizes:
        key = f"batch_{batch_size}"
        prompts = make_prompts(batch_size, prompt_len, config["vocabulary_size"], args.seed)
        expected = batch_size * new_tokens
        prepared = {}  # contender -> its inputs for these prompts, made before any clock starts

        def run_once(name):
            """`(token_ids, wall seconds, process CPU seconds)` of one
            `generate` call, the device's work included; then (untimed)
            checks the output and the number of new tokens."""
            (token_ids, valid), wall, cpu = timed_call(lambda: runners[name][1](prepared[name]), synchronize)
            generated = count_new_tokens(token_ids, valid, prompts)
            if generated != expected:
                raise AssertionError(
                    f"{name} generated {generated} new tokens, expected {batch_size} x {new_tokens} = {expected}"
                )
            return token_ids, wall, cpu

        print(f"\n## batch {batch_size}")
        for name in list(runners):
            try:
                prepared[name] = runners[name][0](prompts)
                token_ids, first, _ = run_once(name)
                for _ in range(args.warmup - 1):
                    run_once(name)
                entry = results[name][key] = {
                    "first_call_s": first, "generated_tokens": expected, "times_s": [], "cpu_s": []
                }
                line = (
                    f"[{name}] batch {batch_size}: first call (compile/warm-up) {first:.2f}s; "
                    f"generated {expected} new tokens (= {batch_size} x {new_tokens})"
                )
                if not args.no_greedy_check:
                    checked, mismatches, worst = greedy_check(runners[name][2], token_ids, prompt_len)
                    entry["greedy_check"] = {"checked": checked, "mismatches": mismatches, "max_gap": worst}
                    if mismatches and not mismatches_allowed:
                        raise AssertionError(
                            f"{name}: {mismatches} of {checked} generated tokens are not the argmax of a full "
                            f"forward over the output (largest logit gap {worst:.3g})"
                        )
                    line += (
                        f"; greedy check: {checked - mismatches} of {checked} tokens the argmax"
                        f"{' (bfloat16: mismatches counted, not fatal)' if mismatches else ''} "
                        f"(largest gap {worst:.1e})"
                    )
                print(line)
                sys.stdout.flush()
            except Exception as error:
                fail(name, error)
        time_interleaved(runners, args.repeats, lambda name: run_once(name)[1:], lambda name: results[name][key], fail)
        for name in runners:
            entry = results[name][key]
            summarise(entry)
            entry["tokens_per_s_median"] = expected / entry["median_s"]
            entry["tokens_per_s_best"] = expected / entry["min_s"]
            step_bytes = decoding_bytes_per_step(
                results[name]["params"], config, batch_size, prompt_len, new_tokens, args.dtype
            )
            bandwidth = step_bytes / (entry["median_s"] / new_tokens)
            entry.update(
                decode_bytes_per_step=step_bytes,
                decode_gb_per_s=bandwidth / 1e9,
                decode_bandwidth_of_peak=bandwidth / peak if peak else None,
            )
            print(
                f"[{name}] batch {batch_size}: median {entry['median_s']:.3f} s "
                f"({entry['tokens_per_s_median']:.1f} new tok/s, decoding {entry['decode_gb_per_s']:.3g} GB/s = "
                f"{fmt_percent(entry['decode_bandwidth_of_peak'])} of peak), min {entry['min_s']:.3f} s, "
                f"median process CPU {entry['cpu_median_s']:.3f} s over {len(entry['times_s'])}; "
                f"all: {', '.join(f'{t:.3f}' for t in entry['times_s'])}"
            )
        sys.stdout.flush()
        gc.collect()
    runners.clear()

    print(
        f"\n## {label}: {shape_name}, {args.dtype}, prompt {prompt_len} + {new_tokens} new tokens, greedy, "
        f"median of {args.repeats} (seconds per generate call)\n"
    )
    columns = (
        "first call s", "median s", "min s", "CPU s", "new tok/s (median)", "new tok/s (best)",
        "ratio (median)", "ratio (min)", "ratio (paired)", "greedy check (argmax / checked)",
        "decode GB/s", "% of peak GB/s",
    )
    print("| contender | batch | " + " | ".join(columns) + " |")
    print("|" + "---|" * (2 + len(columns)))
    ours = results.get("ours", {})
    for batch_size in args.batch_sizes:
        key = f"batch_{batch_size}"
        for name, entry in results.items():
            if "error" in entry or "median_s" not in entry.get(key, {}):
                print(f"| {name} | {batch_size} | failed | " + " | ".join(["-"] * (len(columns) - 1)) + " |")
                continue
            e = entry[key]
            cells = [f"{e['first_call_s']:.2f}"]
            cells += [f"{e['median_s']:.3f}", f"{e['min_s']:.3f}", f"{e['cpu_median_s']:.3f}"]
            cells += [f"{e['tokens_per_s_median']:.1f}", f"{e['tokens_per_s_best']:.1f}"]
            cells += ratio_cells(e, None if "error" in ours else ours.get(key))
            greedy = e.get("greedy_check")
            cells.append(f"{greedy['checked'] - greedy['mismatches']} / {greedy['checked']}" if greedy else "-")
            cells += [f"{e['decode_gb_per_s']:.3g}", fmt_percent(e["decode_bandwidth_of_peak"])]
            print(f"| {name} | {batch_size} | " + " | ".join(cells) + " |")
    print(
        "\nfirst call s = the first generate call of the batch size alone (compilation, recording, warm-up)."
        "\nnew tok/s = batch x new tokens / wall time of one generate call (prompt pass included)."
        + RATIO_NOTE
        + ("; on CUDA it includes the wait for the device)." if device == "cuda" and backend == "torch" else ").")
        + f"\ndecode GB/s = bytes a decoding step reads / time per step: the weights once (parameters x "
        f"{BYTES_PER_ELEMENT[args.dtype]} bytes,"
        "\nthe tied token embedding included) + the key/value cache at the average attended length prompt +"
        "\nnew tokens / 2 (2 x layers x batch x length x hidden x bytes); time per step = median time / new"
        "\ntokens, which includes the prompt pass, so this slightly understates the decoding bandwidth."
        + "\n% of peak GB/s"
        + (f" = of {peak / 1e9:g} GB/s ({peak_source})." if peak else f": '-', {peak_source}.")
    )
    print(load_line("end"))

    if args.json:
        payload = {
            "backend": backend,
            "label": label,
            "device": description,
            "dtype": args.dtype,
            "cpu": cpu_model(),
            "threads": args.threads,
            "versions": versions(backend),
            "model": config,
            "gpt2_small": is_gpt2_small(config),
            "batch_sizes": args.batch_sizes,
            "prompt_len": prompt_len,
            "new_tokens": new_tokens,
            "repeats": args.repeats,
            "warmup": args.warmup,
            "jit_compile": args.jit_compile,
            "peak_bandwidth_bytes_per_s": peak,
            "peak_bandwidth_source": peak_source,
            "load_average_end": load_average(),
            "results": results,
        }
        write_json(args.json, payload)
    failed = [name for name, entry in results.items() if "error" in entry]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
