"""Times loading a model from local files, and its peak memory: ours against
KerasHub's and Hugging Face transformers', each load in a fresh process.

Models (random weights, written once by ``--prepare``; nothing is
downloaded): ``bert_base`` (110M parameters) and ``gpt2_large`` (774M, 3.1 GB
in float32). Each is saved three ways under ``--directory``:

* ``<model>/transformers``: ``save_pretrained`` of ``transformers``
  (``config.json`` + ``model.safetensors``);
* ``<model>/native``: this library's preset, converted from the former;
* ``<model>/keras_hub``: a KerasHub preset of a KerasHub backbone of the
  same shape (its own random weights: only the time and memory count).

Contenders (each ``from_preset`` / ``from_pretrained`` of a backbone, on
the Keras backend of ``KERAS_BACKEND``, float32):

* ``ours_native``, ``ours_transformers``: ``BertBackbone`` / ``GPTBackbone``
  ``.from_preset`` of our preset, and of the ``transformers`` directory
  (converted on the fly);
* ``keras_hub``: KerasHub's ``BertBackbone`` / ``GPT2Backbone``
  ``.from_preset`` of its preset;
* ``transformers``: ``BertModel`` / ``GPT2Model`` ``.from_pretrained``.

Every load runs in a new Python process that has already imported its
libraries and started the Keras backend (import and start-up are not
counted): the wall time of the load call, and
the process' peak resident memory during it above the resident memory just
before (``VmHWM`` after resetting it), next to the size of the weights.
Rounds interleave the contenders (``--repeats`` rounds). Reported: the median
time and the ratio other / ours (above 1: ours is faster), and the median
peak memory as a multiple of the weights' size.

Example::

    python -m benchmarks.load_benchmark --prepare --models bert_base
    KERAS_BACKEND=torch python -m benchmarks.load_benchmark --models bert_base gpt2_large
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.timing import cpu_model
from benchmarks.timing import peak_rss
from benchmarks.timing import reset_peak_rss

MODULE = "benchmarks.load_benchmark"  # what each load's fresh process runs
ROOT = Path(__file__).resolve().parent.parent  # where it runs from

SHAPES = {
    "bert_base": dict(vocabulary_size=30522, num_layers=12, num_heads=12, hidden_dim=768, intermediate_dim=3072,
                      max_sequence_length=512),
    "gpt2_large": dict(vocabulary_size=50257, num_layers=36, num_heads=20, hidden_dim=1280, intermediate_dim=5120,
                       max_sequence_length=1024),
}
CONTENDERS = ("ours_native", "ours_transformers", "keras_hub", "transformers")


def prepare(directory, model):
    """Writes the three checkpoints of `model` under `directory/model`."""
    import transformers

    shape = SHAPES[model]
    root = Path(directory) / model
    if model == "bert_base":
        config = transformers.BertConfig(
            vocab_size=shape["vocabulary_size"], num_hidden_layers=shape["num_layers"],
            num_attention_heads=shape["num_heads"], hidden_size=shape["hidden_dim"],
            intermediate_size=shape["intermediate_dim"], max_position_embeddings=shape["max_sequence_length"],
        )
        reference = transformers.BertModel(config)
    else:
        config = transformers.GPT2Config(
            vocab_size=shape["vocabulary_size"], n_layer=shape["num_layers"], n_head=shape["num_heads"],
            n_embd=shape["hidden_dim"], n_positions=shape["max_sequence_length"],
        )
        reference = transformers.GPT2Model(config)
    reference.save_pretrained(root / "transformers")
    del reference

    import keras_hub

    import attention_zoo_keras as azk

    ours_cls = azk.models.BertBackbone if model == "bert_base" else azk.models.GPTBackbone
    ours_cls.from_preset(str(root / "transformers")).save_to_preset(root / "native")
    if model == "bert_base":
        theirs = keras_hub.models.BertBackbone(
            vocabulary_size=shape["vocabulary_size"], num_layers=shape["num_layers"], num_heads=shape["num_heads"],
            hidden_dim=shape["hidden_dim"], intermediate_dim=shape["intermediate_dim"],
            max_sequence_length=shape["max_sequence_length"],
        )
    else:
        theirs = keras_hub.models.GPT2Backbone(
            vocabulary_size=shape["vocabulary_size"], num_layers=shape["num_layers"], num_heads=shape["num_heads"],
            hidden_dim=shape["hidden_dim"], intermediate_dim=shape["intermediate_dim"],
            max_sequence_length=shape["max_sequence_length"],
        )
    theirs.save_to_preset(str(root / "keras_hub"))
    print(f"prepared {root}")


def load_once(directory, model, contender):
    """One timed load in this process (imports first); prints a JSON line."""
    root = Path(directory) / model
    if contender.startswith("ours"):
        import attention_zoo_keras as azk

        cls = azk.models.BertBackbone if model == "bert_base" else azk.models.GPTBackbone
        path = root / ("native" if contender == "ours_native" else "transformers")
        load = lambda: cls.from_preset(str(path))  # noqa: E731
    elif contender == "keras_hub":
        import keras_hub

        cls = keras_hub.models.BertBackbone if model == "bert_base" else keras_hub.models.GPT2Backbone
        load = lambda: cls.from_preset(str(root / "keras_hub"))  # noqa: E731
    else:
        import transformers

        cls = transformers.BertModel if model == "bert_base" else transformers.GPT2Model
        load = lambda: cls.from_pretrained(root / "transformers")  # noqa: E731
    if contender != "transformers":  # start the backend (JAX's XLA client) outside the timed load
        import keras

        keras.ops.convert_to_numpy(keras.ops.ones((1,)) + 1)
    weights = sum(f.stat().st_size for f in (root / "transformers").glob("*.safetensors"))
    before, method = reset_peak_rss()
    start = time.perf_counter()
    loaded = load()
    seconds = time.perf_counter() - start
    peak = peak_rss() - before
    del loaded
    print(json.dumps({"seconds": seconds, "peak_bytes": peak, "weights_bytes": weights, "peak_method": method}))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--directory", default="benchmarks/results/load_checkpoints")
    parser.add_argument("--models", nargs="+", default=["bert_base"], choices=sorted(SHAPES))
    parser.add_argument("--contenders", nargs="+", default=list(CONTENDERS), choices=CONTENDERS)
    parser.add_argument("--repeats", type=int, default=3, help="rounds of one load per contender (0: only --prepare)")
    parser.add_argument("--prepare", action="store_true", help="write the checkpoints first")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--once", nargs=2, metavar=("MODEL", "CONTENDER"), help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.once:
        load_once(arguments.directory, *arguments.once)
        return
    if arguments.prepare:
        for model in arguments.models:
            prepare(arguments.directory, model)
        if arguments.repeats == 0:
            return
    backend = os.environ.get("KERAS_BACKEND", "tensorflow")
    print(f"machine: {cpu_model()}, {os.cpu_count()} cores; Python {platform.python_version()}; "
          f"KERAS_BACKEND={backend}")
    results = {}
    for model in arguments.models:
        runs = {contender: [] for contender in arguments.contenders}
        for round_index in range(arguments.repeats):
            order = arguments.contenders[round_index % len(arguments.contenders):] + \
                arguments.contenders[: round_index % len(arguments.contenders)]
            for contender in order:
                output = subprocess.run(
                    [sys.executable, "-m", MODULE, "--directory", str(Path(arguments.directory).resolve()),
                     "--once", model, contender],
                    check=True, capture_output=True, text=True, cwd=ROOT,
                ).stdout
                runs[contender].append(json.loads(output.strip().splitlines()[-1]))
        results[model] = runs
        ours = statistics.median(run["seconds"] for run in runs.get("ours_native", runs[arguments.contenders[0]]))
        print(f"\n{model}: median of {arguments.repeats} loads, each in a fresh process")
        print(f"{'contender':<20}{'load s':>9}{'vs ours_native':>16}{'peak / weights':>16}")
        for contender, contender_runs in runs.items():
            seconds = statistics.median(run["seconds"] for run in contender_runs)
            memory = statistics.median(run["peak_bytes"] / run["weights_bytes"] for run in contender_runs)
            print(f"{contender:<20}{seconds:>9.3f}{seconds / ours:>15.2f}x{memory:>15.2f}x")
    if arguments.json:
        Path(arguments.json).write_text(json.dumps({"backend": backend, "results": results}, indent=2))


if __name__ == "__main__":
    main()
