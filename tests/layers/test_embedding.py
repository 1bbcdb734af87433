"""The library's `Embedding`: Keras' layer whose table is read in its own
dtype under mixed precision on every path, so the table's gradient is
summed in float32 (Keras' own layer, called from a model's
`stateless_call`, casts the table to bfloat16 first and sums the gradient
in bfloat16); otherwise what Keras' layer computes (float32, bfloat16,
LoRA, int8 quantization)."""

import keras
import numpy as np
import pytest

from attention_zoo_keras import backend_support
from attention_zoo_keras.layers.embedding import Embedding

IDS = np.array([[1, 2, 3, 0], [3, 3, 1, 2]], "int32")


def _pair(dtype="float32"):
    """Ours and Keras' `Embedding(5, 4)`, built, with the same weights."""
    ours, theirs = Embedding(5, 4, dtype=dtype), keras.layers.Embedding(5, 4, dtype=dtype)
    weights = [np.random.default_rng(0).normal(size=(5, 4)).astype("float32")]
    for layer in (ours, theirs):
        layer.build((None, 4))
        layer.set_weights(weights)
    return ours, theirs


def _numpy(x):
    return keras.ops.convert_to_numpy(keras.ops.cast(x, "float32"))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "mixed_bfloat16"])
def test_computes_keras_embedding(dtype):
    ours, theirs = _pair(dtype)
    np.testing.assert_array_equal(_numpy(ours(IDS)), _numpy(theirs(IDS)))
    assert ours(IDS).dtype == theirs(IDS).dtype
    assert ours.name.startswith("embedding") and [w.path.split("/")[-1] for w in ours.weights] == ["embeddings"]
    assert isinstance(ours, keras.layers.Embedding)


def test_mixed_precision_table_gradient_is_summed_in_float32():
    """2,000 positions hold token 1; the upstream gradient's values are
    bfloat16 numbers (what the cast to the compute dtype passes back).
    Their sums in float64 are the reference: a bfloat16 sum (8 bits of
    mantissa) would be off by far more than the tolerance."""
    rng = np.random.default_rng(0)
    ids = np.where(rng.random((4, 500)) < 0.9, 1, rng.integers(0, 5, (4, 500))).astype("int32")
    inputs = keras.Input((500,), dtype="int32")
    model = keras.Model(inputs, Embedding(5, 16, dtype="mixed_bfloat16")(inputs))
    table = model.trainable_variables[0].value
    cotangent = keras.ops.cast(rng.normal(size=(4, 500, 16)).astype("float32"), "bfloat16")
    output, pullback = backend_support.vjp(lambda tables: model.stateless_call(tables, [], ids)[0], [table])
    (gradient,) = pullback(cotangent)
    expected = np.zeros((5, 16))
    np.add.at(expected, ids.reshape(-1), _numpy(cotangent).reshape(-1, 16).astype("float64"))
    assert keras.backend.standardize_dtype(output.dtype) == "bfloat16"
    assert keras.backend.standardize_dtype(gradient.dtype) == "float32"
    np.testing.assert_allclose(_numpy(gradient), expected, rtol=1e-4, atol=1e-4)


def test_lora_and_int8_quantization_compute_what_keras_computes():
    ours, theirs = _pair()
    for layer in (ours, theirs):
        layer.enable_lora(2, a_initializer="ones", b_initializer="ones")
    np.testing.assert_allclose(_numpy(ours(IDS)), _numpy(theirs(IDS)), atol=1e-6)
    ours, theirs = _pair()
    for layer in (ours, theirs):
        layer.quantize("int8")
    np.testing.assert_allclose(_numpy(ours(IDS)), _numpy(theirs(IDS)), atol=1e-6)
