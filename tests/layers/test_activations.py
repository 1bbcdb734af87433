"""The activations named in checkpoints' configs (`layers.activations`): the
exact GELU is x·Φ(x) in every dtype on every backend; the tanh form is
another function."""

import math

import keras
import numpy as np
import pytest

from attention_zoo_keras.layers import get_activation

X = np.linspace(-9.0, 9.0, 4001).astype("float32")
EXACT = np.array([v * 0.5 * (1.0 + math.erf(v / math.sqrt(2.0))) for v in X.astype("float64")])


@pytest.mark.parametrize("name", ["gelu", "gelu_exact"])
@pytest.mark.parametrize("dtype, tolerance", [("float32", 2e-6), ("bfloat16", 8e-3)])
def test_exact_gelu_is_x_times_the_normal_cdf(name, dtype, tolerance):
    y = get_activation(name)(keras.ops.convert_to_tensor(X, dtype=dtype))
    assert keras.backend.standardize_dtype(y.dtype) == dtype
    got = keras.ops.convert_to_numpy(keras.ops.cast(y, "float32")).astype("float64")
    np.testing.assert_allclose(got, EXACT, atol=tolerance, rtol=tolerance)


def test_approximate_gelu_is_the_tanh_form():
    y = keras.ops.convert_to_numpy(get_activation("gelu_new")(keras.ops.convert_to_tensor(X)))
    tanh_form = 0.5 * X * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (X + 0.044715 * X**3)))
    np.testing.assert_allclose(y, tanh_form, atol=2e-6)
    assert np.abs(y - EXACT).max() > 1e-4  # a different function

