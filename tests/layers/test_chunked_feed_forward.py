"""`FeedForward(chunk_size=…)`: the feed-forward network applied to the
sequence a chunk of positions at a time (the Reformer's chunked
feed-forward, transformers' `apply_chunking_to_forward`) gives the
unchunked output and gradients — eagerly, in a compiled model and in a
training step — and its config round-trips (old configs without
`chunk_size` still load)."""

import keras
import numpy as np
import pytest

from attention_zoo_keras import registration
from attention_zoo_keras.layers.feed_forward import FeedForward

DIM, INTERMEDIATE = 8, 24


def numpy(x):
    return keras.ops.convert_to_numpy(x)


def twins(chunk_size, activation="gelu", output_dim=None, input_shape=(2, 10, DIM)):
    """An unchunked and a chunked layer with the same weights."""
    whole = FeedForward(INTERMEDIATE, activation=activation, output_dim=output_dim)
    chunked = FeedForward(INTERMEDIATE, activation=activation, output_dim=output_dim, chunk_size=chunk_size)
    whole.build(input_shape)
    chunked.build(input_shape)
    chunked.set_weights(whole.get_weights())
    return whole, chunked


def inputs(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype("float32")


@pytest.mark.parametrize(
    "length,chunk_size", [(12, 4), (10, 4), (10, 3), (7, 1), (5, 5), (3, 8), (1, 2), (16, 15)]
)
def test_chunked_equals_unchunked(length, chunk_size):
    x = inputs((2, length, DIM))
    whole, chunked = twins(chunk_size)
    np.testing.assert_allclose(numpy(chunked(x)), numpy(whole(x)), rtol=1e-6, atol=1e-6)


def test_other_output_width_and_extra_axes():
    """`output_dim` and inputs `(batch, length, …, dim)`: axis 1 is chunked."""
    whole, chunked = twins(3, activation="relu", output_dim=5, input_shape=(2, 7, 3, DIM))
    x = inputs((2, 7, 3, DIM))
    got = numpy(chunked(x))
    assert got.shape == (2, 7, 3, 5)
    np.testing.assert_allclose(got, numpy(whole(x)), rtol=1e-6, atol=1e-6)


def test_compiled_model_and_training_step():
    """In a functional model (any length), `predict` (compiled) agrees, and
    one SGD step moves both layers' weights identically."""
    models = []
    for chunk_size in (None, 4):
        tokens = keras.Input((None, DIM))
        layer = FeedForward(INTERMEDIATE, chunk_size=chunk_size, name="ffn")
        model = keras.Model(tokens, layer(tokens))
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
        models.append(model)
    whole, chunked = models
    chunked.set_weights(whole.get_weights())
    for length in (10, 12, 3):
        x = inputs((4, length, DIM), seed=length)
        np.testing.assert_allclose(
            chunked.predict(x, verbose=0), whole.predict(x, verbose=0), rtol=1e-6, atol=1e-6
        )
    x, y = inputs((4, 10, DIM), seed=1), inputs((4, 10, DIM), seed=2)
    losses = [model.train_on_batch(x, y) for model in models]
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-6)
    for a, b in zip(whole.get_weights(), chunked.get_weights()):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)


def test_dynamic_length_in_a_tensorflow_graph():
    """On TensorFlow the length may be unknown while tracing (chunks of a
    dynamic count, the last one padded)."""
    if keras.backend.backend() != "tensorflow":
        pytest.skip("a graph with an unknown length is a TensorFlow case")
    import tensorflow as tf

    whole, chunked = twins(4)
    function = tf.function(chunked, input_signature=[tf.TensorSpec((None, None, DIM), tf.float32)])
    for length in (10, 4, 13):
        x = inputs((2, length, DIM), seed=length)
        np.testing.assert_allclose(numpy(function(x)), numpy(whole(x)), rtol=1e-6, atol=1e-6)


def test_config_round_trip():
    layer = FeedForward(INTERMEDIATE, activation="relu", chunk_size=64, name="ffn")
    config = layer.get_config()
    assert config["chunk_size"] == 64
    rebuilt = registration.deserialize(registration.serialize(layer))
    assert rebuilt.chunk_size == 64 and rebuilt.get_config() == config
    # A config written before chunk_size existed loads, unchunked.
    del config["chunk_size"]
    assert FeedForward.from_config(config).chunk_size is None
    assert FeedForward(INTERMEDIATE).get_config()["chunk_size"] is None


def test_saved_model_round_trip(tmp_path):
    tokens = keras.Input((None, DIM))
    model = keras.Model(tokens, FeedForward(INTERMEDIATE, chunk_size=3)(tokens))
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    x = inputs((2, 7, DIM))
    assert loaded.layers[-1].chunk_size == 3
    np.testing.assert_allclose(numpy(loaded(x)), numpy(model(x)), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("chunk_size", [0, -2, 2.5, "4", True])
def test_bad_chunk_size_is_named(chunk_size):
    with pytest.raises(ValueError, match="chunk_size must be None or a positive integer; got"):
        FeedForward(INTERMEDIATE, chunk_size=chunk_size)


def test_rank_two_inputs_cannot_be_chunked():
    layer = FeedForward(INTERMEDIATE, chunk_size=2)
    with pytest.raises(ValueError, match=r"chunks axis 1, the sequence, .* got inputs of shape \(3, 8\)"):
        layer(inputs((3, DIM)))
