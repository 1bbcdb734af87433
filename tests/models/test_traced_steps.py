"""`predict`, `evaluate` and `fit` on torch replay a recorded step per input
signature (`TracedSteps`): the outputs, losses, metrics and trained weights
are the eager steps' for every family (dropout on), one recording serves
every batch of a shape, later weight changes are seen, variables a step
assigns (Transformer-XL's stream memory, metrics) are carried, and a step
that draws from a seeded generator runs eagerly. On JAX and TensorFlow the
same tests check that Keras' compiled steps give the eager results too."""

import logging

import keras
import numpy as np
import pytest

import attention_zoo_keras as azk
from attention_zoo_keras.backend_support import cuda_graphs
from tests.support.devices import needs_cuda
from tests.support.tiny_models import random_ids
from tests.support.tiny_models import rng
from tests.support.tiny_models import task_cases
from tests.support.tiny_models import text_features
from tests.support.tiny_models import tiny_bert
from tests.support.tiny_models import tiny_reformer
from tests.support.tiny_models import zero_targets

TORCH = keras.backend.backend() == "torch"
def _eager(model, x, batch_size):
    """`model(x)` batch by batch, concatenated (as `predict` returns it)."""
    outputs = []
    for start in range(0, len(next(iter(x.values()))), batch_size):
        batch = {name: value[start : start + batch_size] for name, value in x.items()}
        outputs.append(model(batch, training=False))
    return keras.tree.map_structure(
        lambda *parts: np.concatenate([keras.ops.convert_to_numpy(part) for part in parts]), *outputs
    )


def _recorded(model, step):
    """How many input signatures of `step` the model has recorded."""
    return len(model.traced_signatures.get(step, []))


def _assert_close(actual, expected):
    keras.tree.map_structure(lambda a, e: np.testing.assert_allclose(a, e, atol=1e-5, rtol=1e-5), actual, expected)


@pytest.mark.parametrize("case", sorted(task_cases()))
def test_predict_gives_the_eager_outputs_with_one_recording_per_shape(case):
    keras.utils.set_random_seed(0)
    model, x = task_cases()[case]()
    predictions = model.predict(x, batch_size=4, verbose=0)  # two batches of one shape
    _assert_close(predictions, _eager(model, x, 4))
    assert _recorded(model, "predict") == (1 if TORCH else 0)
    model.predict(x, batch_size=4, verbose=0)
    assert _recorded(model, "predict") == (1 if TORCH else 0)


def test_a_new_shape_is_recorded_once_and_logged(caplog):
    keras.utils.set_random_seed(0)
    model = azk.models.BertTextClassifier(tiny_bert(), num_classes=2, dropout=0.0)
    with caplog.at_level(logging.INFO, logger="attention_zoo_keras"):
        model.predict(text_features(4, 8), batch_size=2, verbose=0)
        model.predict(text_features(4, 12), batch_size=2, verbose=0)
        model.predict(text_features(4, 8), batch_size=2, verbose=0)
    recorded = [record.getMessage() for record in caplog.records if "recording the forward pass" in record.getMessage()]
    if TORCH:
        assert _recorded(model, "predict") == 2
        assert len(recorded) == 2
        assert recorded[0].startswith("BertTextClassifier: recording the forward pass for inputs ")
        assert "int32[2, 12]" in recorded[1]
    else:
        assert recorded == []


def test_predict_sees_weights_changed_after_the_recording():
    keras.utils.set_random_seed(0)
    model = azk.models.BertTextClassifier(tiny_bert(), num_classes=2, dropout=0.0)
    x = text_features(4, 8)
    before = model.predict(x, batch_size=4, verbose=0)
    kernel = model.get_layer("classifier").kernel
    kernel.assign(kernel.numpy() + 1.0)
    after = model.predict(x, batch_size=4, verbose=0)
    assert np.abs(after - before).max() > 1e-2
    _assert_close(after, _eager(model, x, 4))


def test_evaluate_computes_the_loss_of_the_eager_outputs():
    keras.utils.set_random_seed(0)
    model = azk.models.BertTextClassifier(tiny_bert(), num_classes=3, dropout=0.0)
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, labels = text_features(8, 12), np.arange(8) % 3
    loss = model.evaluate(x, labels, batch_size=4, verbose=0, return_dict=True)["loss"]
    logits = _eager(model, x, 4)
    logits = logits - logits.max(axis=-1, keepdims=True)
    expected = np.mean(np.log(np.exp(logits).sum(axis=-1)) - logits[np.arange(8), labels])
    np.testing.assert_allclose(loss, expected, rtol=1e-5)
    assert _recorded(model, "test") == (1 if TORCH else 0)


@needs_cuda
def test_cuda_predict_and_evaluate_replay_one_captured_graph_each(monkeypatch):
    """On CUDA each recorded step is replayed as a captured CUDA graph; the
    graph's outputs are copies, so each batch's predictions survive the next."""
    captures = []
    original = cuda_graphs.GraphReplay
    monkeypatch.setattr(cuda_graphs, "GraphReplay", lambda *args: captures.append(args) or original(*args))
    keras.utils.set_random_seed(0)
    model = azk.models.BertTextClassifier(tiny_bert(), num_classes=3, dropout=0.0)
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, labels = text_features(12, 8), np.arange(12) % 3
    for _ in range(2):
        _assert_close(model.predict(x, batch_size=4, verbose=0), _eager(model, x, 4))  # three batches of one shape
    assert len(captures) == 1
    loss = model.evaluate(x, labels, batch_size=4, verbose=0, return_dict=True)["loss"]
    logits = _eager(model, x, 4)
    logits = logits - logits.max(axis=-1, keepdims=True)
    expected = np.mean(np.log(np.exp(logits).sum(axis=-1)) - logits[np.arange(12), labels])
    np.testing.assert_allclose(loss, expected, rtol=1e-5)
    assert len(captures) == 2


def test_transformer_xl_stream_memory_is_carried_between_replayed_batches():
    keras.utils.set_random_seed(0)
    backbone = azk.models.TransformerXLBackbone(
        vocabulary_size=30, num_layers=1, num_heads=2, hidden_dim=8, head_dim=4, intermediate_dim=16,
        mem_len=4, cutoffs=[10, 20], div_val=2, dropout=0.0,
    )
    lm = azk.models.TransformerXLCausalLM(backbone)
    segments = [random_ids(2, 5) for _ in range(3)]  # three consecutive segments of 2 streams
    lm.reset_memory(2)
    eager = [keras.ops.convert_to_numpy(lm({"token_ids": segment}, training=False)) for segment in segments]
    lm.reset_memory(2)
    predicted = lm.predict({"token_ids": np.concatenate(segments)}, batch_size=2, verbose=0)
    # predict's batches are the segments in order; each continues the memory the previous one left.
    _assert_close(predicted, np.concatenate(eager))
    assert _recorded(lm, "predict") == (1 if TORCH else 0)


def test_a_forward_pass_that_draws_random_numbers_runs_eagerly():
    """Without a `hash_seed` the Reformer draws new LSH rotations at every
    call; a recording would replay one frozen draw."""
    keras.utils.set_random_seed(0)
    model = azk.models.ReformerTextClassifier(tiny_reformer(hash_seed=None), num_classes=2)
    states = [variable for variable in model.variables if variable.name == "seed_generator_state"]
    assert states
    x = {"token_ids": random_ids(8, 8), "padding_mask": np.ones((8, 8), "int32")}
    model.predict(x, batch_size=4, verbose=0)
    first = [keras.ops.convert_to_numpy(state).copy() for state in states]
    model.predict(x, batch_size=4, verbose=0)
    # Every batch draws again: the generators move on, as they do eagerly.
    assert any((keras.ops.convert_to_numpy(state) != before).any() for state, before in zip(states, first))


def _fit(model, x, y, run_eagerly, optimizer=None):
    metrics = {name: ["mae"] for name in y} if isinstance(y, dict) else ["mae"]
    model.compile(
        optimizer=optimizer or azk.optimizers.FusedAdam(1e-2), loss="mse", metrics=metrics, weighted_metrics=[],
        run_eagerly=run_eagerly,
    )
    keras.utils.set_random_seed(1)  # the same dropout draws in both runs
    return model.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0).history


def _assert_same_weights(model, eager_model, tolerance=1e-5):
    """The weights of `model` equal those of `eager_model` (within `tolerance`)."""
    assert len(model.weights) == len(eager_model.weights)
    for weight, eager_weight in zip(model.weights, eager_model.weights):
        np.testing.assert_allclose(
            keras.ops.convert_to_numpy(weight), keras.ops.convert_to_numpy(eager_weight), atol=tolerance,
            rtol=tolerance, err_msg=weight.path,
        )


@pytest.mark.parametrize("case", sorted(task_cases()))
def test_fit_gives_the_eager_weights_with_one_recording_per_shape(case):
    """Dropout stays on: the replayed step draws what the eager one draws."""
    # A torch replay computes what the eager step does to the bit, so the
    # tasks' default FusedAdam is checked there; XLA (JAX, TensorFlow) rounds
    # differently, and Adam's normalisation would turn the rounding noise of
    # near-zero gradients (a key bias's, which softmax ignores) into whole steps.
    optimizer = (lambda: azk.optimizers.FusedAdam(1e-2)) if TORCH else (lambda: keras.optimizers.SGD(0.1, momentum=0.9))
    keras.utils.set_random_seed(0)
    eager_model, x = task_cases()[case]()
    y = zero_targets(eager_model, x)
    eager_history = _fit(eager_model, x, y, run_eagerly=True, optimizer=optimizer())
    keras.utils.set_random_seed(0)
    model, _ = task_cases()[case]()
    initial = [keras.ops.convert_to_numpy(weight).copy() for weight in model.weights]
    history = _fit(model, x, y, run_eagerly=False, optimizer=optimizer())
    assert history.keys() == eager_history.keys()
    for name in history:  # the loss and the metrics
        np.testing.assert_allclose(history[name], eager_history[name], rtol=1e-5, atol=1e-6, err_msg=name)
    assert max(np.abs(keras.ops.convert_to_numpy(w) - w0).max() for w, w0 in zip(model.weights, initial)) > 1e-4
    # XLA compiles the eager and the fitted step as different programs that round differently; four SGD
    # steps with momentum carry that to 1.4e-5 in Transformer-XL's embedding (XLA without most optimizations).
    _assert_same_weights(model, eager_model, tolerance=1e-5 if TORCH else 3e-5)
    assert _recorded(model, "train") == (1 if TORCH else 0)  # four steps of one shape
    assert _recorded(eager_model, "train") == 0


def test_a_replayed_training_step_draws_new_dropout_masks():
    keras.utils.set_random_seed(0)
    model = azk.models.BertTextClassifier(tiny_bert(), num_classes=2, dropout=0.5)
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse", metrics=[], weighted_metrics=[])
    x, y = text_features(4, 8), np.zeros((4, 2), "float32")
    losses = [model.train_on_batch(x, y) for _ in range(3)]
    assert len(set(losses)) == 3  # unchanged weights, new masks
    assert _recorded(model, "train") == (1 if TORCH else 0)


def test_a_training_step_that_draws_from_a_seeded_generator_runs_eagerly(caplog):
    """Without a `hash_seed` the Reformer draws LSH rotations from a Keras
    generator at every call; a recording would replay one frozen draw."""
    keras.utils.set_random_seed(0)
    eager_model = azk.models.ReformerTextClassifier(tiny_reformer(hash_seed=None), num_classes=2)
    x = {"token_ids": random_ids(8, 8), "padding_mask": np.ones((8, 8), "int32")}
    y = np.zeros((8, 2), "float32")
    eager_history = _fit(eager_model, x, y, run_eagerly=True)
    keras.utils.set_random_seed(0)
    model = azk.models.ReformerTextClassifier(tiny_reformer(hash_seed=None), num_classes=2)
    with caplog.at_level(logging.INFO, logger="attention_zoo_keras"):
        history = _fit(model, x, y, run_eagerly=False)
    np.testing.assert_allclose(history["loss"], eager_history["loss"], rtol=1e-5)
    messages = [record.getMessage() for record in caplog.records]
    if TORCH:
        assert any("recording the training step" in message for message in messages)
    _assert_same_weights(model, eager_model)


def test_any_keras_optimizer_updates_the_replayed_gradients():
    """The optimizer runs after the replay, so Keras' own torch optimizers
    (which read the learning rate into Python) work too."""
    keras.utils.set_random_seed(0)
    eager_model = azk.models.BertTextClassifier(tiny_bert(), num_classes=3, dropout=0.0)
    x, y = text_features(8, 12), np.zeros((8, 3), "float32")
    _fit(eager_model, x, y, run_eagerly=True, optimizer=keras.optimizers.SGD(0.1, momentum=0.9))
    keras.utils.set_random_seed(0)
    model = azk.models.BertTextClassifier(tiny_bert(), num_classes=3, dropout=0.0)
    _fit(model, x, y, run_eagerly=False, optimizer=keras.optimizers.SGD(0.1, momentum=0.9))
    _assert_same_weights(model, eager_model)


@pytest.mark.slow  # inductor takes about a minute for the two programs on 2 CPU cores
@pytest.mark.skipif(not TORCH, reason="counts torch.compile's programs (JAX and TensorFlow compile with XLA)")
def test_jit_compile_compiles_each_step_once_per_shape_and_keeps_the_results():
    from torch._dynamo.utils import counters

    x, y = text_features(8, 12), rng.normal(size=(8, 3)).astype("float32")
    results = []
    for jit_compile in (False, True):
        keras.utils.set_random_seed(0)
        # No dropout: inductor draws its own masks.
        model = azk.models.BertTextClassifier(tiny_bert(dropout=0.0, attention_dropout=0.0), num_classes=3, dropout=0.0)
        # SGD: Adam would turn float-rounding differences of near-zero gradients into whole steps.
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", metrics=[], weighted_metrics=[],
                      jit_compile=jit_compile)
        compiled_before = counters["stats"]["unique_graphs"]
        predictions = model.predict(x, batch_size=4, verbose=0)  # two batches of one shape
        history = model.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0).history  # four steps
        assert counters["stats"]["unique_graphs"] - compiled_before == (2 if jit_compile else 0)
        weights = {weight.path: keras.ops.convert_to_numpy(weight) for weight in model.weights}
        results.append((predictions, history["loss"], weights))
    (eager_predictions, eager_losses, eager_weights), (predictions, losses, weights) = results
    np.testing.assert_allclose(predictions, eager_predictions, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(losses, eager_losses, rtol=1e-5)
    for path, weight in weights.items():
        np.testing.assert_allclose(weight, eager_weights[path], atol=1e-5, rtol=1e-5, err_msg=path)


@pytest.mark.skipif(not TORCH, reason="the recordings are torch's; XLA's bfloat16 rounding differs from eager")
@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_mixed_precision_training_replays_the_eager_step(policy):
    """float16 goes through a `LossScaleOptimizer`, whose scale the recording reads."""
    x, y = text_features(8, 12), np.zeros((8, 3), "float32")
    results = []
    try:
        keras.config.set_dtype_policy(policy)
        for run_eagerly in (True, False):
            keras.utils.set_random_seed(0)
            model = azk.models.BertTextClassifier(tiny_bert(), num_classes=3, dropout=0.0)
            optimizer = azk.optimizers.FusedAdam(1e-2)
            if policy == "mixed_float16":
                optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
            history = _fit(model, x, y, run_eagerly=run_eagerly, optimizer=optimizer)
            results.append((history, {weight.path: keras.ops.convert_to_numpy(weight) for weight in model.weights}))
    finally:
        keras.config.set_dtype_policy("float32")
    (eager_history, eager_weights), (history, weights) = results
    assert _recorded(model, "train") == 1
    assert history == eager_history
    for path, weight in weights.items():
        np.testing.assert_array_equal(weight, eager_weights[path], err_msg=path)
