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

TORCH = keras.backend.backend() == "torch"
rng = np.random.default_rng(0)


def _ids(batch, length, vocabulary=30):
    return rng.integers(1, vocabulary, (batch, length)).astype("int32")


def _padded_mask(batch, length):
    """Ones, with the second half of the rows padded after position 2."""
    mask = np.ones((batch, length), "int32")
    mask[batch // 2 :, 3:] = 0
    return mask


def _bert(num_layers=1, **overrides):
    return azk.models.BertBackbone(
        vocabulary_size=30, num_layers=num_layers, num_heads=2, hidden_dim=8, intermediate_dim=16,
        max_sequence_length=16, **overrides,
    )


def _gpt(**overrides):
    arguments = dict(vocabulary_size=30, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16,
                     max_sequence_length=16)
    return azk.models.GPTBackbone(**{**arguments, **overrides})


def _text_features(batch, length):
    return {"token_ids": _ids(batch, length), "segment_ids": np.zeros((batch, length), "int32"),
            "padding_mask": _padded_mask(batch, length)}


def _reformer(hash_seed):
    return azk.models.ReformerBackbone(
        vocabulary_size=30, hidden_dim=8, num_heads=2, head_dim=4, intermediate_dim=16,
        attention_layers=["local", "lsh"], num_hashes=1, num_buckets=[2, 2], lsh_chunk_length=4,
        local_chunk_length=4, axial_pos_shape=(2, 4), axial_pos_embds_dim=(4, 4), hash_seed=hash_seed,
        dropout=0.0, local_attention_dropout=0.0, lsh_attention_dropout=0.0,
    )


def _vilbert_features(batch):
    return {
        "token_ids": _ids(batch, 6, vocabulary=20), "segment_ids": np.zeros((batch, 6), "int32"),
        "padding_mask": _padded_mask(batch, 6),
        "region_features": rng.normal(size=(batch, 3, 4)).astype("float32"),
        "region_boxes": np.tile(np.array([0.1, 0.1, 0.5, 0.5, 0.16], "float32"), (batch, 3, 1)),
        "region_mask": np.ones((batch, 3), "int32"),
    }


def _cases():
    """(model, inputs of 8 examples) for every family's tasks."""
    return {
        "bert_classifier": lambda: (
            azk.models.BertTextClassifier(_bert(2), num_classes=3, dropout=0.0), _text_features(8, 12)),
        "bert_masked_lm": lambda: (
            azk.models.BertMaskedLM(_bert()),
            {**_text_features(8, 12), "mask_positions": np.tile(np.array([1, 4], "int32"), (8, 1))}),
        "gpt_causal_lm": lambda: (
            azk.models.GPTCausalLM(_gpt()), {"token_ids": _ids(8, 10), "padding_mask": _padded_mask(8, 10)}),
        "gpt_linear_attention": lambda: (
            azk.models.GPTCausalLM(_gpt(attention="linear", attention_dropout=0.0)),
            {"token_ids": _ids(8, 10), "padding_mask": np.ones((8, 10), "int32")}),
        "vit_classifier": lambda: (
            azk.models.ViTImageClassifier(
                azk.models.ViTBackbone(image_size=16, patch_size=8, num_layers=1, num_heads=2, hidden_dim=8,
                                       intermediate_dim=16), num_classes=3),
            {"images": rng.normal(size=(8, 16, 16, 3)).astype("float32")}),
        "seq2seq_lm": lambda: (
            azk.models.TransformerSeq2SeqLM(azk.models.TransformerBackbone(
                vocabulary_size=30, num_encoder_layers=1, num_decoder_layers=1, num_heads=2, hidden_dim=8,
                intermediate_dim=16, max_sequence_length=16)),
            {"encoder_token_ids": _ids(8, 9), "encoder_padding_mask": _padded_mask(8, 9),
             "decoder_token_ids": _ids(8, 7), "decoder_padding_mask": np.ones((8, 7), "int32")}),
        "transformer_xl_backbone": lambda: (
            azk.models.TransformerXLBackbone(
                vocabulary_size=30, num_layers=1, num_heads=2, hidden_dim=8, head_dim=4, intermediate_dim=16,
                mem_len=4, cutoffs=[10, 20], div_val=2),
            {"token_ids": _ids(8, 5), "memory": rng.normal(size=(8, 1, 4, 8)).astype("float32")}),
        "reformer_classifier": lambda: (
            azk.models.ReformerTextClassifier(_reformer(hash_seed=0), num_classes=2),
            {"token_ids": _ids(8, 8), "padding_mask": _padded_mask(8, 8)}),
        "vilbert_vqa": lambda: (
            azk.models.ViLBERTVisualQuestionAnswerer(
                azk.models.ViLBERTBackbone(
                    vocabulary_size=20, num_layers=2, num_heads=2, hidden_dim=8, intermediate_dim=16,
                    region_feature_dim=4, visual_num_layers=2, visual_num_heads=2, visual_hidden_dim=8,
                    visual_intermediate_dim=16, co_attention_dim=8, co_attention_num_heads=2,
                    co_attention_text_layers=[1, 2], co_attention_visual_layers=[0, 1], max_sequence_length=8),
                num_answers=5),
            _vilbert_features(8)),
    }


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


@pytest.mark.parametrize("case", sorted(_cases()))
def test_predict_gives_the_eager_outputs_with_one_recording_per_shape(case):
    keras.utils.set_random_seed(0)
    model, x = _cases()[case]()
    predictions = model.predict(x, batch_size=4, verbose=0)  # two batches of one shape
    _assert_close(predictions, _eager(model, x, 4))
    assert _recorded(model, "predict") == (1 if TORCH else 0)
    model.predict(x, batch_size=4, verbose=0)
    assert _recorded(model, "predict") == (1 if TORCH else 0)


def test_a_new_shape_is_recorded_once_and_logged(caplog):
    keras.utils.set_random_seed(0)
    model = azk.models.BertTextClassifier(_bert(), num_classes=2, dropout=0.0)
    with caplog.at_level(logging.INFO, logger="attention_zoo_keras"):
        model.predict(_text_features(4, 8), batch_size=2, verbose=0)
        model.predict(_text_features(4, 12), batch_size=2, verbose=0)
        model.predict(_text_features(4, 8), batch_size=2, verbose=0)
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
    model = azk.models.BertTextClassifier(_bert(), num_classes=2, dropout=0.0)
    x = _text_features(4, 8)
    before = model.predict(x, batch_size=4, verbose=0)
    kernel = model.get_layer("classifier").kernel
    kernel.assign(kernel.numpy() + 1.0)
    after = model.predict(x, batch_size=4, verbose=0)
    assert np.abs(after - before).max() > 1e-2
    _assert_close(after, _eager(model, x, 4))


def test_evaluate_computes_the_loss_of_the_eager_outputs():
    keras.utils.set_random_seed(0)
    model = azk.models.BertTextClassifier(_bert(), num_classes=3, dropout=0.0)
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, labels = _text_features(8, 12), np.arange(8) % 3
    loss = model.evaluate(x, labels, batch_size=4, verbose=0, return_dict=True)["loss"]
    logits = _eager(model, x, 4)
    logits = logits - logits.max(axis=-1, keepdims=True)
    expected = np.mean(np.log(np.exp(logits).sum(axis=-1)) - logits[np.arange(8), labels])
    np.testing.assert_allclose(loss, expected, rtol=1e-5)
    assert _recorded(model, "test") == (1 if TORCH else 0)


def test_transformer_xl_stream_memory_is_carried_between_replayed_batches():
    keras.utils.set_random_seed(0)
    backbone = azk.models.TransformerXLBackbone(
        vocabulary_size=30, num_layers=1, num_heads=2, hidden_dim=8, head_dim=4, intermediate_dim=16,
        mem_len=4, cutoffs=[10, 20], div_val=2, dropout=0.0,
    )
    lm = azk.models.TransformerXLCausalLM(backbone)
    segments = [_ids(2, 5) for _ in range(3)]  # three consecutive segments of 2 streams
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
    model = azk.models.ReformerTextClassifier(_reformer(hash_seed=None), num_classes=2)
    states = [variable for variable in model.variables if variable.name == "seed_generator_state"]
    assert states
    x = {"token_ids": _ids(8, 8), "padding_mask": np.ones((8, 8), "int32")}
    model.predict(x, batch_size=4, verbose=0)
    first = [keras.ops.convert_to_numpy(state).copy() for state in states]
    model.predict(x, batch_size=4, verbose=0)
    # Every batch draws again: the generators move on, as they do eagerly.
    assert any((keras.ops.convert_to_numpy(state) != before).any() for state, before in zip(states, first))


def _zeros_like_outputs(model, x):
    """Regression targets of the model's output structure (all zeros)."""
    outputs = model(x, training=False)
    return keras.tree.map_structure(lambda value: np.zeros(keras.ops.shape(value), "float32"), outputs)


def _fit(model, x, y, run_eagerly, optimizer=None):
    metrics = {name: ["mae"] for name in y} if isinstance(y, dict) else ["mae"]
    model.compile(
        optimizer=optimizer or azk.optimizers.FusedAdam(1e-2), loss="mse", metrics=metrics, weighted_metrics=[],
        run_eagerly=run_eagerly,
    )
    keras.utils.set_random_seed(1)  # the same dropout draws in both runs
    return model.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0).history


def _assert_same_weights(model, eager_model):
    """The weights of `model` equal those of `eager_model` (within 1e-5)."""
    assert len(model.weights) == len(eager_model.weights)
    for weight, eager_weight in zip(model.weights, eager_model.weights):
        np.testing.assert_allclose(
            keras.ops.convert_to_numpy(weight), keras.ops.convert_to_numpy(eager_weight), atol=1e-5, rtol=1e-5,
            err_msg=weight.path,
        )


@pytest.mark.parametrize("case", sorted(_cases()))
def test_fit_gives_the_eager_weights_with_one_recording_per_shape(case):
    """Dropout stays on: the replayed step draws what the eager one draws."""
    # A torch replay computes what the eager step does to the bit, so the
    # tasks' default FusedAdam is checked there; XLA (JAX, TensorFlow) rounds
    # differently, and Adam's normalisation would turn the rounding noise of
    # near-zero gradients (a key bias's, which softmax ignores) into whole steps.
    optimizer = (lambda: azk.optimizers.FusedAdam(1e-2)) if TORCH else (lambda: keras.optimizers.SGD(0.1, momentum=0.9))
    keras.utils.set_random_seed(0)
    eager_model, x = _cases()[case]()
    y = _zeros_like_outputs(eager_model, x)
    eager_history = _fit(eager_model, x, y, run_eagerly=True, optimizer=optimizer())
    keras.utils.set_random_seed(0)
    model, _ = _cases()[case]()
    initial = [keras.ops.convert_to_numpy(weight).copy() for weight in model.weights]
    history = _fit(model, x, y, run_eagerly=False, optimizer=optimizer())
    assert history.keys() == eager_history.keys()
    for name in history:  # the loss and the metrics
        np.testing.assert_allclose(history[name], eager_history[name], rtol=1e-5, atol=1e-6, err_msg=name)
    assert max(np.abs(keras.ops.convert_to_numpy(w) - w0).max() for w, w0 in zip(model.weights, initial)) > 1e-4
    _assert_same_weights(model, eager_model)
    assert _recorded(model, "train") == (1 if TORCH else 0)  # four steps of one shape
    assert _recorded(eager_model, "train") == 0


def test_a_replayed_training_step_draws_new_dropout_masks():
    keras.utils.set_random_seed(0)
    model = azk.models.BertTextClassifier(_bert(), num_classes=2, dropout=0.5)
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse", metrics=[], weighted_metrics=[])
    x, y = _text_features(4, 8), np.zeros((4, 2), "float32")
    losses = [model.train_on_batch(x, y) for _ in range(3)]
    assert len(set(losses)) == 3  # unchanged weights, new masks
    assert _recorded(model, "train") == (1 if TORCH else 0)


def test_a_training_step_that_draws_from_a_seeded_generator_runs_eagerly(caplog):
    """Without a `hash_seed` the Reformer draws LSH rotations from a Keras
    generator at every call; a recording would replay one frozen draw."""
    keras.utils.set_random_seed(0)
    eager_model = azk.models.ReformerTextClassifier(_reformer(hash_seed=None), num_classes=2)
    x = {"token_ids": _ids(8, 8), "padding_mask": np.ones((8, 8), "int32")}
    y = np.zeros((8, 2), "float32")
    eager_history = _fit(eager_model, x, y, run_eagerly=True)
    keras.utils.set_random_seed(0)
    model = azk.models.ReformerTextClassifier(_reformer(hash_seed=None), num_classes=2)
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
    eager_model = azk.models.BertTextClassifier(_bert(), num_classes=3, dropout=0.0)
    x, y = _text_features(8, 12), np.zeros((8, 3), "float32")
    _fit(eager_model, x, y, run_eagerly=True, optimizer=keras.optimizers.SGD(0.1, momentum=0.9))
    keras.utils.set_random_seed(0)
    model = azk.models.BertTextClassifier(_bert(), num_classes=3, dropout=0.0)
    _fit(model, x, y, run_eagerly=False, optimizer=keras.optimizers.SGD(0.1, momentum=0.9))
    _assert_same_weights(model, eager_model)


@pytest.mark.slow  # inductor takes about a minute for the two programs on 2 CPU cores
@pytest.mark.skipif(not TORCH, reason="counts torch.compile's programs (JAX and TensorFlow compile with XLA)")
def test_jit_compile_compiles_each_step_once_per_shape_and_keeps_the_results():
    from torch._dynamo.utils import counters

    x, y = _text_features(8, 12), rng.normal(size=(8, 3)).astype("float32")
    results = []
    for jit_compile in (False, True):
        keras.utils.set_random_seed(0)
        # No dropout: inductor draws its own masks.
        model = azk.models.BertTextClassifier(_bert(dropout=0.0, attention_dropout=0.0), num_classes=3, dropout=0.0)
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
    x, y = _text_features(8, 12), np.zeros((8, 3), "float32")
    results = []
    try:
        keras.config.set_dtype_policy(policy)
        for run_eagerly in (True, False):
            keras.utils.set_random_seed(0)
            model = azk.models.BertTextClassifier(_bert(), num_classes=3, dropout=0.0)
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
