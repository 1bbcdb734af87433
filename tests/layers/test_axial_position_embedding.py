"""`AxialPositionEmbedding` against transformers' `AxialPositionEmbeddings`
(Reformer, Kitaev et al., 2020) given the same weights: exact (1e-6) at
inference for any length and start, and while training on the whole table;
transformers' training-length rule and its column dropout."""

import keras
import numpy as np
import pytest

from attention_zoo_keras import registration
from attention_zoo_keras.layers.axial_position_embedding import AxialPositionEmbedding

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from transformers.models.reformer.modeling_reformer import AxialPositionEmbeddings  # noqa: E402

SHAPE, DIMS = (4, 8), (6, 10)  # 32 positions, 16 wide


def numpy(x):
    return keras.ops.convert_to_numpy(x)


def reference(dropout=0.0, seed=0):
    """transformers' module with random weights (it initialises them to ones)."""
    config = transformers.ReformerConfig(
        axial_pos_shape=SHAPE,
        axial_pos_embds_dim=DIMS,
        hidden_size=sum(DIMS),
        attn_layers=["local"],
        local_attn_chunk_length=8,
        hidden_dropout_prob=dropout,
    )
    module = AxialPositionEmbeddings(config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for weight in module.weights:
            weight.copy_(torch.randn(weight.shape, generator=generator))
    return module


def converted(module, **kwargs):
    """Ours, with transformers' `weights.0` and `weights.1` copied unchanged."""
    layer = AxialPositionEmbedding(SHAPE, DIMS, **kwargs)
    layer.build()
    layer.embeddings_0.assign(module.weights[0].detach().numpy())
    layer.embeddings_1.assign(module.weights[1].detach().numpy())
    return layer


def reference_output(module, batch, length, start=0):
    position_ids = torch.arange(start, start + length).unsqueeze(0).expand(batch, length)
    with torch.no_grad():
        return module(position_ids).numpy()


def test_weights_have_transformers_shapes():
    module = reference()
    layer = AxialPositionEmbedding(SHAPE, DIMS)
    layer.build()
    assert [w.path.split("/")[-1] for w in layer.weights] == ["embeddings_0", "embeddings_1"]
    shapes = [tuple(w.shape) for w in layer.weights]
    assert shapes == [tuple(w.shape) for w in module.weights] == [(4, 1, 6), (1, 8, 10)]


@pytest.mark.parametrize("length,start", [(32, 0), (1, 0), (5, 0), (8, 0), (13, 0), (13, 7), (1, 31), (4, 28)])
def test_inference_matches_transformers(length, start):
    module = reference().eval()
    layer = converted(module)
    batch = 2
    expected = reference_output(module, batch, length, start)
    got = numpy(layer(np.zeros((batch, length), "int32"), start_index=start))
    assert got.shape == (1, length, sum(DIMS))
    np.testing.assert_allclose(np.broadcast_to(got, expected.shape), expected, atol=1e-6)


def test_start_index_tensor_and_hidden_state_inputs():
    module = reference().eval()
    layer = converted(module)
    expected = reference_output(module, 1, 6, start=10)
    start = keras.ops.convert_to_tensor(10, "int32")
    got = numpy(layer(np.zeros((3, 6, sum(DIMS)), "float32"), start_index=start))
    np.testing.assert_allclose(got, expected, atol=1e-6)


def test_training_matches_transformers_without_dropout():
    module = reference(dropout=0.0).train()
    layer = converted(module)
    expected = reference_output(module, 2, 32)
    got = numpy(layer(np.zeros((2, 32), "int32"), training=True))
    np.testing.assert_allclose(np.broadcast_to(got, expected.shape), expected, atol=1e-6)


def test_training_needs_the_full_length_like_transformers():
    module = reference().train()
    with pytest.raises(ValueError, match="multiply to sequence length"):
        reference_output(module, 2, 12)
    layer = converted(module)
    with pytest.raises(ValueError, match=r"got length 12, but axial_pos_shape \(4, 8\) has 32 positions"):
        layer(np.zeros((2, 12), "int32"), training=True)
    with pytest.raises(ValueError, match="start_index must be 0; got 4"):
        layer(np.zeros((2, 32), "int32"), start_index=4, training=True)


def test_inference_length_limit_like_transformers():
    module = reference().eval()
    with pytest.raises(ValueError, match="multiply at least to"):
        reference_output(module, 1, 33)
    layer = converted(module)
    with pytest.raises(ValueError, match=r"length 33\) do not fit the 32 positions"):
        layer(np.zeros((1, 33), "int32"))
    with pytest.raises(ValueError, match=r"start_index 30, length 4\) do not fit the 32 positions"):
        layer(np.zeros((1, 4), "int32"), start_index=30)


def column_structure(output, table, rate):
    """Checks `output` `(batch, n₁·n₂, d)`: for each sequence and column `c`
    the positions `r·n₂ + c` are all zero or all `table / (1 − rate)`;
    returns the `(batch, n₂)` kept pattern."""
    batch, (rows, columns) = output.shape[0], SHAPE
    by_column = output.reshape(batch, rows, columns, -1)
    scaled = np.broadcast_to(table.reshape(1, rows, columns, -1) / (1 - rate), by_column.shape)
    kept = np.all(np.isclose(by_column, scaled, atol=1e-5), axis=(1, 3))
    dropped = np.all(by_column == 0, axis=(1, 3))
    assert np.all(kept | dropped), "a column is partly dropped"
    return kept


def test_dropout_drops_whole_columns_per_sequence_like_transformers():
    rate, batch = 0.5, 16
    module = reference(dropout=rate)
    table = reference_output(module.eval(), 1, 32)[0]
    torch.manual_seed(0)
    theirs = reference_output(module.train(), batch, 32)
    layer = converted(module, dropout=rate, seed=1)
    ours = numpy(layer(np.zeros((batch, 32), "int32"), training=True))
    assert ours.shape == theirs.shape == (batch, 32, sum(DIMS))
    for output in (theirs, ours):
        kept = column_structure(output, table, rate)
        assert 0.2 < kept.mean() < 0.8  # 128 independent columns at rate 0.5
        assert len({tuple(row) for row in kept}) > 1  # each sequence draws its own
    # No dropout at inference, and none with dropout=0.
    np.testing.assert_allclose(numpy(layer(np.zeros((batch, 32), "int32")))[0], table, atol=1e-6)


def test_in_a_compiled_model():
    module = reference().eval()
    layer = converted(module)
    tokens = keras.Input((None,), dtype="int32")
    embedded = keras.layers.Embedding(10, sum(DIMS), embeddings_initializer="zeros")(tokens)
    model = keras.Model(tokens, keras.layers.Add()([embedded, layer(tokens)]))
    got = model.predict(np.zeros((3, 20), "int32"), verbose=0)
    np.testing.assert_allclose(got, reference_output(module, 3, 20), atol=1e-6)


def test_config_round_trip():
    layer = AxialPositionEmbedding([4, 8], [6, 10], dropout=0.1, seed=3, name="axial")
    rebuilt = registration.deserialize(registration.serialize(layer))
    assert rebuilt.get_config() == layer.get_config()
    assert rebuilt.axial_pos_shape == (4, 8) and rebuilt.dropout == 0.1
    layer.build()
    rebuilt.build()
    assert [tuple(w.shape) for w in rebuilt.weights] == [tuple(w.shape) for w in layer.weights]


def test_default_initializer_is_transformers_standard_normal():
    keras.utils.set_random_seed(0)
    layer = AxialPositionEmbedding((64, 64), (16, 16))
    layer.build()
    values = np.concatenate([numpy(w).ravel() for w in layer.weights])
    # 2048 draws: the standard errors of the mean and the std are 0.022 and 0.016; bounds at 5 of them.
    assert abs(values.std() - 1.0) < 0.08 and abs(values.mean()) < 0.11


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"axial_pos_shape": (32,)}, r"axial_pos_shape must be a pair of positive integers; got \(32,\)"),
        ({"axial_pos_shape": (4, 0)}, r"axial_pos_shape must be a pair of positive integers; got \(4, 0\)"),
        ({"axial_pos_embds_dim": 16}, "axial_pos_embds_dim must be a pair of positive integers; got 16"),
        ({"dropout": 1.0}, r"dropout must be in \[0, 1\); got 1.0"),
    ],
)
def test_bad_arguments_are_named(kwargs, message):
    arguments = {"axial_pos_shape": SHAPE, "axial_pos_embds_dim": DIMS, **kwargs}
    with pytest.raises(ValueError, match=message):
        AxialPositionEmbedding(**arguments)


def test_hidden_width_must_match():
    layer = AxialPositionEmbedding(SHAPE, DIMS)
    with pytest.raises(ValueError, match=r"hidden states are 12 wide, but axial_pos_embds_dim \(6, 10\) sums to 16"):
        layer(np.zeros((1, 4, 12), "float32"))
