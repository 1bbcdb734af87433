"""Times a BERT-base-shaped encoder: ours against KerasHub's (and, on torch,
Hugging Face transformers'), in one process, on the same inputs.

The Keras backend is the one KERAS_BACKEND names; run the script once per
backend (benchmarks/run_bert_benchmark.sh does all three). Weights are random:
nothing is downloaded.

Contenders (all BERT-base: vocab 30522, 12 layers, 12 heads, hidden 768,
intermediate 3072, 512 positions, 2 segments, dropout 0.1; or with --small
4 layers, 2 heads, hidden 128, intermediate 512):

* ``ours``: ``attention_zoo_keras.models.BertBackbone``.
* ``ours_eager`` (torch only): the same model called eagerly,
  ``model(inputs, training=False)``, as in a notebook, and trained with
  ``compile(run_eagerly=True)`` (Keras' eager torch step, no recording).
* ``keras_hub``: ``keras_hub.models.BertBackbone``.
* ``transformers`` (torch backend only): ``transformers.BertModel`` with
  ``attn_implementation="sdpa"``.
* ``transformers_compiled`` (torch only, inference): the same under
  ``torch.compile`` (transformers at its best).

Measured, per contender:

* inference: the Keras models go through the same call path,
  ``model.predict_on_batch(inputs)`` (a ``jax.jit``-compiled stateless call on
  JAX; a ``tf.function``, XLA-compiled when ``jit_compile`` resolves to True,
  on TensorFlow; on torch ours replays a recording of the step made once per
  input shape, compiled by inductor with ``--jit-compile true``, while
  KerasHub's runs eagerly); transformers runs
  ``model(**inputs)`` in eval mode under ``torch.no_grad()``.
* training: one optimizer step on the mean squared error of the pooled output
  against zeros, Adam(1e-5), dropout active. Keras models:
  ``model.train_on_batch`` after ``compile`` (ours with the library's
  ``FusedAdam``, which its tasks compile with by default; KerasHub with
  ``keras.optimizers.Adam``); transformers: a manual forward / backward /
  ``torch.optim.Adam`` step. On torch ours replays its forward and backward
  pass recorded once per input shape, then applies the fused update.

All contenders are built first; each mode is then warmed up (compiled) per
contender, and the ``--repeats`` timed calls are interleaved round-robin
(rotating who goes first) so that other load on the machine weighs on every
contender alike. Reported: the median and the minimum of the wall times
(``time.perf_counter``), and the median process CPU time
(``time.process_time``). The ratio columns are other / ours, above 1 meaning
ours is faster: of the medians, of the minima, and "paired", the median over
rounds of each round's ratio, which is the one to trust on a busy machine.

Example::

    KERAS_BACKEND=jax python benchmarks/bert_benchmark.py --batch-size 8 --seq-len 128
"""

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
import traceback

# Shared helpers (stdlib-only at import time, so they run before numpy/Keras).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import apply_backend_threads  # noqa: E402
from timing import cpu_model  # noqa: E402
from timing import fmt_ms  # noqa: E402
from timing import limit_threads  # noqa: E402
from timing import paired_ratio  # noqa: E402
from timing import versions  # noqa: E402

BERT_BASE = dict(
    vocabulary_size=30522,
    num_layers=12,
    num_heads=12,
    hidden_dim=768,
    intermediate_dim=3072,
    max_sequence_length=512,
    num_segments=2,
)
# A small encoder (--small): 4 layers, 128 wide, where per-op dispatch,
# not arithmetic, sets the speed (the CPU target of issue 20).
SMALL = dict(BERT_BASE, num_layers=4, num_heads=2, hidden_dim=128, intermediate_dim=512)
# A few-second smoke test of the script itself (--tiny); not a benchmark.
TINY = dict(BERT_BASE, num_layers=2, num_heads=2, hidden_dim=64, intermediate_dim=128)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per measurement")
    parser.add_argument("--warmup", type=int, default=1, help="untimed calls (compilation) first")
    parser.add_argument(
        "--threads", type=int, default=os.cpu_count(),
        help="intra-op (and inter-op) threads, the same for every contender (default: all cores)",
    )
    parser.add_argument(
        "--backend-label", default=None,
        help="label printed for this run (default: the Keras backend's name)",
    )
    parser.add_argument(
        "--jit-compile", default="auto", choices=["auto", "true", "false"],
        help="`jit_compile` given to compile() of both Keras models",
    )
    parser.add_argument(
        "--contenders", default="ours,ours_eager,keras_hub,transformers,transformers_compiled",
        help="comma-separated subset of ours,ours_eager,keras_hub,transformers,transformers_compiled "
        "(ours_eager: `model(inputs, training=False)` and an eager `train_on_batch` (`run_eagerly=True`); "
        "transformers_compiled: `torch.compile` of the transformers model, inference only; both torch only)",
    )
    parser.add_argument("--modes", default="inference,training", help="comma-separated subset")
    parser.add_argument(
        "--no-padding", action="store_true",
        help="every row full length (default: rows of random length in [seq_len/2, seq_len])",
    )
    parser.add_argument("--small", action="store_true", help="a 4-layer, 128-wide encoder instead of BERT-base")
    parser.add_argument("--tiny", action="store_true", help="2-layer, 64-wide smoke test of the script")
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    return parser.parse_args(argv)


def make_inputs(batch_size, seq_len, vocabulary_size, no_padding, seed=0):
    import numpy as np

    rng = np.random.default_rng(seed)
    if no_padding:
        lengths = np.full((batch_size,), seq_len)
    else:
        lengths = rng.integers(seq_len // 2, seq_len + 1, size=(batch_size,))
        lengths[0] = seq_len  # the batch spans the whole length
    positions = np.arange(seq_len)[None, :]
    padding_mask = (positions < lengths[:, None]).astype("int32")
    token_ids = rng.integers(1, vocabulary_size, size=(batch_size, seq_len)).astype("int32")
    token_ids = token_ids * padding_mask
    # Two segments: the second half of each row's real tokens is segment 1.
    segment_ids = ((positions >= (lengths[:, None] // 2)) & (padding_mask > 0)).astype("int32")
    return {"token_ids": token_ids, "segment_ids": segment_ids, "padding_mask": padding_mask}


# --------------------------------------------------------------------------- Keras


def build_ours(config):
    from attention_zoo_keras.models import BertBackbone

    return BertBackbone(**config)


def build_keras_hub(config):
    import keras_hub

    return keras_hub.models.BertBackbone(**config)


def keras_steps(model, inputs, jit_compile, config, optimizer, run_eagerly=False):
    """The inference and training callables of a Keras backbone, both through
    the public Trainer API so ours and KerasHub's take the same path."""
    import keras
    import numpy as np

    jit = {"auto": "auto", "true": True, "false": False}[jit_compile]
    model.compile(
        optimizer=optimizer,
        loss={"pooled_output": keras.losses.MeanSquaredError()},
        jit_compile=False if run_eagerly else jit,
        run_eagerly=run_eagerly,
    )
    targets = {"pooled_output": np.zeros((inputs["token_ids"].shape[0], config["hidden_dim"]), "float32")}

    def infer():
        return model.predict_on_batch(inputs)

    def train():
        return model.train_on_batch(inputs, targets)

    return infer, train, (
        f"predict_on_batch / train_on_batch with {type(optimizer).__name__} "
        f"(jit_compile={model.jit_compile}, run_eagerly={model.run_eagerly})"
    )


def check_outputs(out, batch_size, seq_len, config):
    import numpy as np

    seq, pooled = np.asarray(out["sequence_output"]), np.asarray(out["pooled_output"])
    assert seq.shape == (batch_size, seq_len, config["hidden_dim"]), seq.shape
    assert pooled.shape == (batch_size, config["hidden_dim"]), pooled.shape
    assert np.isfinite(seq).all() and np.isfinite(pooled).all()


def check_loss(logs):
    import numpy as np

    loss = logs["loss"] if isinstance(logs, dict) else logs
    assert np.isfinite(float(np.asarray(loss))), logs


# --------------------------------------------------------------------------- transformers


def transformers_steps(inputs, config):
    import torch
    import transformers

    hf_config = transformers.BertConfig(
        vocab_size=config["vocabulary_size"],
        hidden_size=config["hidden_dim"],
        num_hidden_layers=config["num_layers"],
        num_attention_heads=config["num_heads"],
        intermediate_size=config["intermediate_dim"],
        max_position_embeddings=config["max_sequence_length"],
        type_vocab_size=config["num_segments"],
        hidden_act="gelu",
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
    )
    hf_config._attn_implementation = "sdpa"
    model = transformers.BertModel(hf_config)
    assert model.config._attn_implementation == "sdpa", model.config._attn_implementation
    torch_inputs = {
        "input_ids": torch.from_numpy(inputs["token_ids"]).long(),
        "token_type_ids": torch.from_numpy(inputs["segment_ids"]).long(),
        "attention_mask": torch.from_numpy(inputs["padding_mask"]).long(),
    }
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-5)
    target = torch.zeros(inputs["token_ids"].shape[0], config["hidden_dim"])

    def infer():
        model.eval()
        with torch.no_grad():
            out = model(**torch_inputs)
        return {"sequence_output": out.last_hidden_state.numpy(), "pooled_output": out.pooler_output.numpy()}

    def train():
        model.train()
        optimizer.zero_grad(set_to_none=True)
        out = model(**torch_inputs)
        loss = torch.nn.functional.mse_loss(out.pooler_output, target)
        loss.backward()
        optimizer.step()
        return float(loss.detach())

    path = "eval + torch.no_grad() model(**inputs) / train: forward, backward, torch.optim.Adam step (sdpa)"
    return model, infer, train, path


def transformers_compiled_steps(inputs, config):
    """transformers at its best for inference: `torch.compile` of the eval
    model (inductor, default mode); no training step."""
    import torch

    model, infer, _, _ = transformers_steps(inputs, config)
    model.eval()
    model.forward = torch.compile(model.forward)
    return model, infer, None, "torch.compile(model.forward), eval + torch.no_grad() (sdpa); inference only"


def ours_eager_steps(model, inputs):
    """Ours called eagerly as in a notebook, `model(inputs, training=False)`
    under `torch.no_grad()`: Keras' per-layer dispatch on every call."""
    import keras
    import torch

    tensors = {name: torch.from_numpy(value) for name, value in inputs.items()}

    def infer():
        with torch.no_grad():
            outputs = model(tensors, training=False)
        return {name: keras.ops.convert_to_numpy(value) for name, value in outputs.items()}

    return infer


# --------------------------------------------------------------------------- main


def main(argv=None):
    args = parse_args(argv)
    limit_threads(args.threads)

    import keras

    backend = keras.backend.backend()
    apply_backend_threads(backend, args.threads)
    label = args.backend_label or backend
    contenders = [c.strip() for c in args.contenders.split(",") if c.strip()]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if backend != "torch":
        contenders = [name for name in contenders if name not in ("transformers", "transformers_compiled", "ours_eager")]

    config = TINY if args.tiny else SMALL if args.small else BERT_BASE
    inputs = make_inputs(args.batch_size, args.seq_len, config["vocabulary_size"], args.no_padding)
    size = "TINY smoke test" if args.tiny else "small (4 layers, 128 wide)" if args.small else "BERT-base"
    print(f"# {size} benchmark, backend={label}")
    print(f"cpu: {cpu_model()} ({os.cpu_count()} logical cores), threads per library: {args.threads}")
    print(f"python {platform.python_version()}; " + ", ".join(f"{k} {v}" for k, v in versions(backend).items()))
    print(
        f"shapes: batch {args.batch_size} x seq_len {args.seq_len} "
        f"({int(inputs['padding_mask'].sum())} of {inputs['padding_mask'].size} tokens unpadded); "
        f"warmup {args.warmup}, repeats {args.repeats} (median reported)"
    )
    print(f"load average at the start (1, 5, 15 min): {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    sys.stdout.flush()

    results = {}  # contender -> {"path": str, mode: {...}} or {"error": str}
    steps = {}  # contender -> {"inference": fn, "training": fn}

    def fail(name, error):
        results[name]["error"] = f"{type(error).__name__}: {error}"
        results[name]["traceback"] = traceback.format_exc()
        steps.pop(name, None)
        print(f"\n[{name}] FAILED:\n{results[name]['traceback']}")
        sys.stdout.flush()

    # Build every contender first, then time them interleaved (round-robin,
    # rotating who goes first), so that anything else loading the machine
    # during the run weighs on all of them alike.
    keras.utils.set_random_seed(0)
    for name in contenders:
        results[name] = {}
        try:
            start = time.perf_counter()
            if name in ("transformers", "transformers_compiled"):
                build = transformers_steps if name == "transformers" else transformers_compiled_steps
                model, infer, train, path = build(inputs, config)
                params = sum(p.numel() for p in model.parameters())
            elif name == "ours_eager":
                from attention_zoo_keras.optimizers import FusedAdam

                model = build_ours(config)
                infer = ours_eager_steps(model, inputs)
                _, train, _ = keras_steps(model, inputs, "false", config, FusedAdam(1e-5), run_eagerly=True)
                path = (
                    "model(inputs, training=False) under torch.no_grad() / "
                    "train_on_batch with FusedAdam and compile(run_eagerly=True)"
                )
                params = model.count_params()
            else:
                model = build_ours(config) if name == "ours" else build_keras_hub(config)
                if name == "ours":
                    from attention_zoo_keras.optimizers import FusedAdam

                    optimizer = FusedAdam(1e-5)
                else:
                    import keras

                    optimizer = keras.optimizers.Adam(1e-5)
                infer, train, path = keras_steps(model, inputs, args.jit_compile, config, optimizer)
                params = model.count_params()
            results[name].update(build_s=time.perf_counter() - start, path=path, params=int(params))
            steps[name] = {"inference": infer, "training": train}
            print(f"[{name}] {params:,} parameters, built in {results[name]['build_s']:.1f}s; {path}")
            sys.stdout.flush()
        except Exception as error:  # report and go on with the other contenders
            fail(name, error)
        model = infer = train = None
        gc.collect()

    checks = {
        "inference": lambda out: check_outputs(out, args.batch_size, args.seq_len, config),
        "training": check_loss,
    }
    for mode in modes:
        for name in list(steps):
            if steps[name][mode] is None:
                continue  # a contender timed in the other mode only
            try:
                start = time.perf_counter()
                checks[mode](steps[name][mode]())
                first = time.perf_counter() - start
                for _ in range(args.warmup - 1):
                    steps[name][mode]()
                results[name][mode] = {"first_call_s": first, "times_s": [], "cpu_s": []}
                print(f"[{name}] {mode}: first call (compile/warm-up) {first:.2f}s")
                sys.stdout.flush()
            except Exception as error:
                fail(name, error)
        names = list(steps)
        for repeat in range(args.repeats):
            shift = repeat % max(len(names), 1)
            for name in names[shift:] + names[:shift]:
                if name not in steps or steps[name][mode] is None:
                    continue
                try:
                    cpu_start, start = time.process_time(), time.perf_counter()
                    steps[name][mode]()
                    wall = time.perf_counter() - start
                    cpu = time.process_time() - cpu_start
                except Exception as error:
                    fail(name, error)
                    continue
                results[name][mode]["times_s"].append(wall)
                results[name][mode]["cpu_s"].append(cpu)
        for name in steps:
            if mode not in results[name]:
                continue
            entry = results[name][mode]
            entry["median_s"] = statistics.median(entry["times_s"])
            entry["min_s"] = min(entry["times_s"])
            entry["cpu_median_s"] = statistics.median(entry["cpu_s"])
            print(
                f"[{name}] {mode:9s} median {entry['median_s'] * 1e3:.1f} ms, min {entry['min_s'] * 1e3:.1f} ms, "
                f"median process CPU {entry['cpu_median_s'] * 1e3:.1f} ms over {len(entry['times_s'])}; "
                f"all: {', '.join(f'{t * 1e3:.0f}' for t in entry['times_s'])}"
            )
        sys.stdout.flush()
    steps.clear()

    print(f"\n## {label}: batch {args.batch_size}, seq_len {args.seq_len}, median of {args.repeats} (ms per step)\n")
    header = "| contender | " + " | ".join(
        f"{m} median ms | {m} min ms | {m} CPU ms | {m} ratio (median) | {m} ratio (min) | {m} ratio (paired)"
        for m in modes
    ) + " |"
    print(header)
    print("|" + "---|" * (1 + 6 * len(modes)))
    ours = results.get("ours", {})
    for name, entry in results.items():
        cells = []
        for mode in modes:
            if "error" not in entry and mode not in entry:
                cells += ["-"] * 6  # not timed in this mode
                continue
            if "error" in entry or "median_s" not in entry.get(mode, {}):
                cells += ["failed", "-", "-", "-", "-", "-"]
                continue
            cells += [fmt_ms(entry[mode][k]).strip() for k in ("median_s", "min_s", "cpu_median_s")]
            if "error" not in ours and "median_s" in ours.get(mode, {}):
                cells.append(f"{entry[mode]['median_s'] / ours[mode]['median_s']:.2f}")
                cells.append(f"{entry[mode]['min_s'] / ours[mode]['min_s']:.2f}")
                paired = paired_ratio(entry[mode]["times_s"], ours[mode]["times_s"])
                entry[mode]["paired_ratio"] = paired
                cells.append(f"{paired:.2f}")
            else:
                cells += ["-", "-", "-"]
        print(f"| {name} | " + " | ".join(cells) + " |")
    print(
        "\nratio = contender / ours (> 1: ours faster): of the medians, of the minima, and 'paired', the median"
        "\nover rounds of the per-round ratio (the contenders run back to back in each round, so this one"
        "\ncancels load that changes between rounds). CPU ms = median process CPU time (all threads)."
    )
    print(f"load average at the end (1, 5, 15 min): {', '.join(f'{x:.2f}' for x in os.getloadavg())}")

    if args.json:
        payload = {
            "backend": backend,
            "label": label,
            "cpu": cpu_model(),
            "threads": args.threads,
            "versions": versions(backend),
            "batch_size": args.batch_size,
            "seq_len": args.seq_len,
            "repeats": args.repeats,
            "warmup": args.warmup,
            "jit_compile": args.jit_compile,
            "padding": not args.no_padding,
            "load_average_end": os.getloadavg(),
            "results": results,
        }
        with open(args.json, "w") as f:
            json.dump(payload, f, indent=2)
    failed = [name for name, entry in results.items() if "error" in entry]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
