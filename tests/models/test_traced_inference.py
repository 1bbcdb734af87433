"""`predict` / `evaluate` on torch replay a recorded forward pass per input
signature (`TracedInference`): the outputs are the eager call's for every
family, one recording serves every batch of a shape, later weight changes
are seen, variables the forward pass assigns (Transformer-XL's stream
memory) are carried, and a forward pass that draws random numbers runs
eagerly. On JAX and TensorFlow the same tests check that Keras' compiled
`predict` gives the eager outputs too."""

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


def _bert(num_layers=1):
    return azk.models.BertBackbone(
        vocabulary_size=30, num_layers=num_layers, num_heads=2, hidden_dim=8, intermediate_dim=16,
        max_sequence_length=16,
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


def _assert_close(actual, expected):
    keras.tree.map_structure(lambda a, e: np.testing.assert_allclose(a, e, atol=1e-5, rtol=1e-5), actual, expected)


@pytest.mark.parametrize("case", sorted(_cases()))
def test_predict_gives_the_eager_outputs_with_one_recording_per_shape(case):
    keras.utils.set_random_seed(0)
    model, x = _cases()[case]()
    predictions = model.predict(x, batch_size=4, verbose=0)  # two batches of one shape
    _assert_close(predictions, _eager(model, x, 4))
    assert len(model.traced_signatures) == (1 if TORCH else 0)
    model.predict(x, batch_size=4, verbose=0)
    assert len(model.traced_signatures) == (1 if TORCH else 0)


def test_a_new_shape_is_recorded_once_and_logged(caplog):
    keras.utils.set_random_seed(0)
    model = azk.models.BertTextClassifier(_bert(), num_classes=2, dropout=0.0)
    with caplog.at_level(logging.INFO, logger="attention_zoo_keras"):
        model.predict(_text_features(4, 8), batch_size=2, verbose=0)
        model.predict(_text_features(4, 12), batch_size=2, verbose=0)
        model.predict(_text_features(4, 8), batch_size=2, verbose=0)
    recorded = [record.getMessage() for record in caplog.records if "recording the forward pass" in record.getMessage()]
    if TORCH:
        assert len(model.traced_signatures) == 2
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
    assert len(model.traced_signatures) == (1 if TORCH else 0)


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
    assert len(lm.traced_signatures) == (1 if TORCH else 0)


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
