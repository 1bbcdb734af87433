"""Padding moved after each row's tokens (`layers.padding_last`): the
order against a numpy reading of the mask, the permutation's gradient (a
gather, not a scatter-add), and BERT with its blocks attending by key
lengths against BERT with the padding mask: the same outputs, training
step and attention maps, for right- and left-padded rows and rows with
holes; the seq2seq Transformer's encoder likewise (outputs, and generated
tokens with the decoding steps' cross-attention given the sources'
lengths). Under JAX both do this by default; the tests build them both ways
on every backend."""

import keras
import numpy as np
import pytest

import attention_zoo_keras as azk
from attention_zoo_keras import backend_support
from attention_zoo_keras.layers.padding_last import PermutePositions
from attention_zoo_keras.layers.padding_last import padding_last_order

MASK = np.array(
    [
        [1, 1, 1, 1, 1, 0, 0, 0],  # right-padded
        [0, 0, 0, 1, 1, 1, 1, 1],  # left-padded
        [1, 0, 1, 1, 0, 1, 0, 1],  # holes
        [1, 1, 1, 1, 1, 1, 1, 1],  # no padding
    ],
    "int32",
)


def _numpy(x):
    return keras.ops.convert_to_numpy(keras.ops.cast(x, "float32"))


def test_order_puts_each_rows_tokens_first_then_its_padding():
    mask = np.concatenate([MASK, np.zeros((1, 8), "int32")])  # and a row without tokens
    order, destination, lengths = (keras.ops.convert_to_numpy(t) for t in padding_last_order(mask))
    for row, got_order, got_destination, got_length in zip(mask, order, destination, lengths):
        tokens, padding = np.flatnonzero(row), np.flatnonzero(row == 0)
        np.testing.assert_array_equal(got_order, np.concatenate([tokens, padding]))
        np.testing.assert_array_equal(got_destination, np.argsort(got_order))
        assert got_length == (len(tokens) or len(row))
    assert order.dtype == destination.dtype == lengths.dtype == np.int32


def test_permutation_gradient_is_the_inverse_gather():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 8, 3)).astype("float32")
    cotangent = rng.standard_normal((4, 8, 3)).astype("float32")
    order, destination, _ = padding_last_order(MASK)
    layer = PermutePositions()
    output, pullback = backend_support.vjp(lambda inputs: layer(inputs[0], order, destination), [x])
    order, destination = keras.ops.convert_to_numpy(order), keras.ops.convert_to_numpy(destination)
    np.testing.assert_array_equal(_numpy(output), np.take_along_axis(x, order[:, :, None], axis=1))
    (gradient,) = pullback(keras.ops.convert_to_tensor(cotangent))
    np.testing.assert_array_equal(_numpy(gradient), np.take_along_axis(cotangent, destination[:, :, None], axis=1))


@pytest.mark.skipif(keras.backend.backend() != "jax", reason="reads a JAX program")
def test_permutation_gradient_has_no_scatter():
    """A gather's own gradient is a scatter-add (atomic adds on a GPU; in
    bfloat16 a compare-and-swap loop): the permutation's is a gather."""
    import jax

    order, destination, _ = padding_last_order(MASK)
    layer = PermutePositions()
    gradient = jax.grad(lambda x: keras.ops.sum(layer(x, order, destination) ** 2))
    program = str(jax.make_jaxpr(gradient)(np.ones((4, 8, 3), "float32")))
    assert "gather" in program and "scatter" not in program


def _pair(monkeypatch, build):
    """`(build() with the padding last, build() with the mask)`, equal
    weights."""
    models = []
    for moves_padding_last in (True, False):
        monkeypatch.setattr(backend_support, "encoders_move_padding_last", lambda: moves_padding_last)
        keras.utils.set_random_seed(0)
        models.append(build())
    assert any(isinstance(layer, PermutePositions) for layer in models[0]._flatten_layers())
    assert not any(isinstance(layer, PermutePositions) for layer in models[1]._flatten_layers())
    models[1].set_weights(models[0].get_weights())
    return models


def _bert_pair(monkeypatch, **overrides):
    config = dict(vocabulary_size=30, num_layers=2, num_heads=2, hidden_dim=16, intermediate_dim=32,
                  max_sequence_length=16, **overrides)
    return _pair(monkeypatch, lambda: azk.models.BertBackbone(**config))


def _inputs(mask=MASK):
    ids = np.random.default_rng(1).integers(1, 30, mask.shape).astype("int32")
    return {"token_ids": ids, "segment_ids": (np.arange(mask.shape[1]) >= 4).astype("int32") * mask,
            "padding_mask": mask}


def test_bert_with_the_padding_last_computes_bert_with_the_mask(monkeypatch):
    """Every position, padding included, and the pooled output."""
    packed, masked = _bert_pair(monkeypatch)
    got, expected = packed(_inputs(), training=False), masked(_inputs(), training=False)
    for name in ("sequence_output", "pooled_output"):
        np.testing.assert_allclose(_numpy(got[name]), _numpy(expected[name]), atol=1e-5, err_msg=name)


def test_a_row_without_tokens_leaves_the_others_alone(monkeypatch):
    packed, masked = _bert_pair(monkeypatch)
    mask = np.concatenate([MASK, np.zeros((1, 8), "int32")])
    got, expected = packed(_inputs(mask), training=False), masked(_inputs(mask), training=False)
    got, expected = _numpy(got["sequence_output"]), _numpy(expected["sequence_output"])
    np.testing.assert_allclose(got[:-1], expected[:-1], atol=1e-5)
    assert np.isfinite(got[-1]).all()


def test_bert_with_the_padding_last_trains_as_bert_with_the_mask(monkeypatch):
    """One SGD step on every output position, dropout off: the same loss
    and weights."""
    packed, masked = _bert_pair(monkeypatch, dropout=0.0, attention_dropout=0.0)
    targets = {"sequence_output": np.ones((4, 8, 16), "float32"), "pooled_output": np.ones((4, 16), "float32")}
    losses = []
    for model in (packed, masked):
        model.compile(optimizer=keras.optimizers.SGD(0.5), loss="mse")
        losses.append(model.train_on_batch(_inputs(), targets))
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)
    for got, expected in zip(packed.trainable_weights, masked.trainable_weights):
        np.testing.assert_allclose(_numpy(got), _numpy(expected), atol=1e-5, err_msg=got.path)


def test_attention_maps_come_in_the_inputs_order(monkeypatch):
    packed, masked = _bert_pair(monkeypatch)
    got, expected = azk.attention_maps(packed, _inputs()), azk.attention_maps(masked, _inputs())
    assert list(got) == list(expected)
    for name in expected:
        np.testing.assert_allclose(got[name], expected[name], atol=1e-6, err_msg=name)
        assert (got[name][1, :, :, :3] == 0).all(), "the left padding gets no weight"


def test_a_seq2seq_encoder_with_the_padding_last_computes_and_generates_as_with_the_mask(monkeypatch):
    def build():
        backbone = azk.models.TransformerBackbone(
            vocabulary_size=30, num_encoder_layers=2, num_decoder_layers=1, num_heads=2, hidden_dim=16,
            intermediate_dim=32, max_sequence_length=16,
        )
        return azk.models.TransformerSeq2SeqLM(backbone)

    packed, masked = _pair(monkeypatch, build)
    ids = np.random.default_rng(2).integers(3, 30, MASK.shape).astype("int32") * MASK
    inputs = {"encoder_token_ids": ids, "encoder_padding_mask": MASK,
              "decoder_token_ids": ids[:, :5], "decoder_padding_mask": np.ones((4, 5), "int32")}
    got, expected = packed.backbone(inputs, training=False), masked.backbone(inputs, training=False)
    for name in ("encoder_sequence_output", "decoder_sequence_output"):
        np.testing.assert_allclose(_numpy(got[name]), _numpy(expected[name]), atol=1e-5, err_msg=name)
    right_padded = (np.arange(8) < np.array([[5], [8], [3], [1]])).astype("int32")  # (what generate takes)
    prompt = {"encoder_token_ids": np.maximum(ids, 3) * right_padded, "encoder_padding_mask": right_padded}
    arguments = dict(max_length=6, num_beams=2, stop_token_ids=None, decoder_start_token_id=1)
    decoded_by_lengths = {}
    for name, model in (("packed", packed), ("masked", masked)):
        decode = model.backbone.decode

        def recording_decode(*args, decode=decode, name=name, **kwargs):
            decoded_by_lengths.setdefault(name, set()).add(kwargs.get("encoder_key_lengths") is not None)
            return decode(*args, **kwargs)

        monkeypatch.setattr(model.backbone, "decode", recording_decode)
    np.testing.assert_array_equal(
        packed.generate(prompt, **arguments)["token_ids"], masked.generate(prompt, **arguments)["token_ids"]
    )
    # The cross-attention of the decoding steps: by the sources' lengths where the encoder moves padding last.
    assert decoded_by_lengths == {"packed": {True}, "masked": {False}}
