"""The activations named in checkpoints' configs (`layers.activations`): the
exact GELU is x·Φ(x) in every dtype on every backend, and so is its
derivative; the tanh form is another function."""

import math
import re

import keras
import numpy as np
import pytest

from attention_zoo_keras import backend_support
from attention_zoo_keras.layers import get_activation

# Dense where Φ bends, and far out, where erf(x/√2) is ±1 in float32.
X = np.concatenate([np.linspace(-9.0, 9.0, 4001), [-1e4, -60.0, -5.66, 5.66, 60.0, 1e4]]).astype("float32")
CDF = np.array([0.5 * (1.0 + math.erf(v / math.sqrt(2.0))) for v in X.astype("float64")])
EXACT = X * CDF
SLOPE = CDF + X * np.exp(-0.5 * X.astype("float64") ** 2) / math.sqrt(2.0 * math.pi)  # Φ(x) + x·φ(x)


@pytest.mark.parametrize("name", ["gelu", "gelu_exact"])
@pytest.mark.parametrize("dtype, tolerance", [("float32", 2e-6), ("bfloat16", 8e-3)])
def test_exact_gelu_is_x_times_the_normal_cdf(name, dtype, tolerance):
    y = get_activation(name)(keras.ops.convert_to_tensor(X, dtype=dtype))
    assert keras.backend.standardize_dtype(y.dtype) == dtype
    got = keras.ops.convert_to_numpy(keras.ops.cast(y, "float32")).astype("float64")
    np.testing.assert_allclose(got, EXACT, atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("dtype, tolerance", [("float32", 2e-6), ("bfloat16", 8e-3)])
def test_exact_gelu_derivative_is_the_cdf_plus_x_times_the_density(dtype, tolerance):
    x = keras.ops.convert_to_tensor(X, dtype=dtype)
    y, pullback = backend_support.vjp(lambda inputs: get_activation("gelu")(inputs[0]), [x])
    (gradient,) = pullback(keras.ops.ones_like(y))
    assert keras.backend.standardize_dtype(gradient.dtype) == dtype
    got = keras.ops.convert_to_numpy(keras.ops.cast(gradient, "float32")).astype("float64")
    np.testing.assert_allclose(got, SLOPE, atol=tolerance, rtol=tolerance)


@pytest.mark.skipif(keras.backend.backend() != "jax", reason="JAX's own exact GELU is the slow form")
def test_exact_gelu_under_jax_computes_no_erfc_or_erf():
    """JAX's `gelu` evaluates erfc (both of its branches for every element
    in XLA); `lax.erf` cannot be read back from an exported SavedModel. The
    library's GELU and its gradient are plain arithmetic and one `exp`."""
    import jax

    def forward_and_gradient(x):
        return jax.value_and_grad(lambda v: get_activation("gelu")(v).sum())(x)

    program = str(jax.make_jaxpr(forward_and_gradient)(X))  # nested programs (jit, custom JVPs) included
    assert not re.search(r"\berfc?\b", program), program


def test_approximate_gelu_is_the_tanh_form():
    y = keras.ops.convert_to_numpy(get_activation("gelu_new")(keras.ops.convert_to_tensor(X)))
    tanh_form = 0.5 * X * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (X + 0.044715 * X**3)))
    np.testing.assert_allclose(y, tanh_form, atol=2e-6)
    assert np.abs(y - EXACT).max() > 1e-4  # a different function

