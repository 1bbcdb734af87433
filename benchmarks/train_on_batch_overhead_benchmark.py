"""Host time of one ``train_on_batch`` step: ours against KerasHub on a
BERT with BERT-base's variable count and almost no arithmetic.

A 12-layer BERT 32 wide (about 200 weights, 600 variables with Adam's
moments, as BERT-base) trained on a batch of 2 × 16 tokens: what a step
costs is what the Keras trainer does around the compiled program (listing
the variables, handing their values in and out, the metrics), the part
that on a GPU runs on the host beside BERT-base's step (issue 22: 24 ms of
host time in a 36 ms step on an H200, for both Keras libraries).

Contenders, all with Keras' ``train_on_batch`` after ``compile`` (mean
squared error of the pooled output against zeros, learning rate 1e-5):

* ``ours``: ``attention_zoo_keras.models.BertBackbone`` with ``FusedAdam``
  (its tasks' default), the variable lists kept between steps
  (``backend_support.JaxTrainerState``);
* ``ours_keras_state``: the same model with Keras' own state handling
  (``JaxTrainerState``'s methods undone for its calls, JAX only), which
  shows what keeping the lists is worth;
* ``kerashub``: ``keras_hub.models.BertBackbone`` with
  ``keras.optimizers.Adam``.

The calls are interleaved round-robin; medians, minima and the paired
ratio other / ours (above 1: ours faster) are printed.

Example::

    KERAS_BACKEND=jax python -m benchmarks.train_on_batch_overhead_benchmark --rounds 30
    bash benchmarks/run.sh train_on_batch_overhead    # every backend, log and JSON in benchmarks/results
"""

import argparse

from benchmarks.contenders import ratio_cells
from benchmarks.contenders import select_contenders
from benchmarks.contenders import time_rounds
from benchmarks.contenders import with_setting
from benchmarks.timing import cpu_line
from benchmarks.timing import fmt_ms
from benchmarks.timing import fmt_versions
from benchmarks.timing import load_line
from benchmarks.timing import start_backend
from benchmarks.timing import versions
from benchmarks.timing import write_json

CONTENDERS = ("ours", "ours_keras_state", "kerashub")
CONFIG = dict(vocabulary_size=1000, num_layers=12, num_heads=2, hidden_dim=32, intermediate_dim=64,
              max_sequence_length=64)


def keras_state_handling(call):
    """`call` with `JaxTrainerState`'s methods undone (Keras' own
    `_get_jax_state`, `jax_state_sync` and attribute tracking) during it."""
    import keras

    from attention_zoo_keras.backend_support import JaxTrainerState

    for name in ("_get_jax_state", "jax_state_sync", "__setattr__"):
        call = with_setting(call, JaxTrainerState, name, getattr(keras.Model, name))
    return call


def build_step(name, batch_size, length):
    """`train_on_batch` of contender `name` on a fixed batch, compiled."""
    import keras
    import numpy as np

    rng = np.random.default_rng(0)
    inputs = {
        "token_ids": rng.integers(0, CONFIG["vocabulary_size"], (batch_size, length)).astype("int32"),
        "segment_ids": np.zeros((batch_size, length), "int32"),
        "padding_mask": np.ones((batch_size, length), "int32"),
    }
    targets = {"pooled_output": np.zeros((batch_size, CONFIG["hidden_dim"]), "float32")}
    if name == "kerashub":
        import keras_hub

        model = keras_hub.models.BertBackbone(**CONFIG)
        optimizer = keras.optimizers.Adam(1e-5)
    else:
        import attention_zoo_keras as azk

        model = azk.models.BertBackbone(**CONFIG)
        optimizer = azk.optimizers.FusedAdam(1e-5)
    model.compile(optimizer=optimizer, loss={"pooled_output": keras.losses.MeanSquaredError()})
    step = lambda: model.train_on_batch(inputs, targets)  # noqa: E731
    if name == "ours_keras_state":
        step = keras_state_handling(step)
    for _ in range(3):  # compiles, builds the optimizer
        step()
    return step, len(model.trainable_variables) + len(optimizer.variables)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30, help="timed calls per contender")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    parser.add_argument("--backend-label", default=None, help="a name for the backend in the output")
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = parser.parse_args(argv)

    backend, _ = start_backend(args.threads)
    names = select_contenders(args.contenders, CONTENDERS)
    if backend != "jax":
        names = [name for name in names if name != "ours_keras_state"]
    print(cpu_line(args.threads))
    print(fmt_versions(versions(backend)))
    print(f"backend {args.backend_label or backend}; 12-layer BERT, 32 wide; batch {args.batch_size} x {args.seq_len}; {args.rounds} rounds")
    steps, counts = {}, {}
    for name in names:
        steps[name], counts[name] = build_step(name, args.batch_size, args.seq_len)
    print(load_line("start"))
    entries = time_rounds(steps, args.rounds)
    print(load_line("end"))
    print(f"{'contender':<18}{'variables':>10}{'median':>10}{'min':>10}{'cpu':>10}   other/ours: median  min  paired")
    for name, entry in entries.items():
        ratios = ratio_cells(entry, entries.get("ours")) if name != "ours" else ["", "", ""]
        print(f"{name:<18}{counts[name]:>10}{fmt_ms(entry['median_s'])}{fmt_ms(entry['min_s'])}"
              f"{fmt_ms(entry['cpu_median_s'])}   {'  '.join(ratios)}")
    if args.json:
        write_json(args.json, {"backend": backend, "args": vars(args), "variables": counts, "results": entries})


if __name__ == "__main__":
    main()
