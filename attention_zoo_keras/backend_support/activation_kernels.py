"""The exact GELU (Hendrycks & Gimpel, 2016), x·Φ(x) = x·(1 + erf(x/√2))/2,
in the form each backend computes fastest.

torch (`gelu`) and TensorFlow (`erf`) have kernels of their own, which
`keras.ops.gelu` reaches. JAX computes the exact GELU as x·erfc(−x/√2)/2,
and XLA evaluates a float32 `erfc` by computing both of its branches for
every element (a polynomial, and an exponential times a rational function,
with three divisions): on an H200 that was most of the gap between our
BERT-base forward and KerasHub's at length 128 (docs/benchmarks.md). XLA's
`erf` is a single rational function, but JAX lowers it to a composite
operation that TensorFlow cannot read back from an exported SavedModel. So
under JAX the GELU evaluates a rational approximation of erf written in
plain arithmetic:

    erf(z) ≈ z·P(z²)/Q(z²) for |z| < 4, sign(z) beyond

with P and Q of degree 5 (`scripts/fit_erf_coefficients.py` fits them; the
error is 2.1e-8 in float64, 4e-7 evaluated in float32), always in float32,
and its derivative Φ(x) + x·φ(x) as a custom JVP (automatic
differentiation of the quotient costs about twice as much). A BERT-base
train step on a 2-core CPU is 1.17× faster than with JAX's own GELU
(docs/benchmarks.md, "JAX: the exact GELU without `erfc`").
"""

import functools
import math

from keras import ops

from attention_zoo_keras.backend_support.environment import backend_name

ERF_NUMERATOR = (
    1.1283789773839439,
    0.19624467256817657,
    0.05346658764877614,
    0.004003346149341806,
    0.00028801524831345224,
    1.9746291076705447e-06,
)
ERF_DENOMINATOR = (
    1.0,
    0.507248480487337,
    0.1164743432934696,
    0.015443874750528656,
    0.0012162486041439559,
    3.747735944876346e-05,
)
# Beyond this |z|, erf(z) is ±1 in float32 (1 − erf(4) = 1.5e-8).
ERF_BOUND = 4.0
# Whether JAX computes the GELU by the rational erf (a benchmark contender
# turns it off to measure JAX's own form).
_RATIONAL_ERF_UNDER_JAX = True


def exact_gelu(x):
    """x·Φ(x) in `x`'s dtype, the form fastest on this backend (see the
    module docstring).

    >>> import numpy as np
    >>> round(float(exact_gelu(np.array([1.0], "float32"))[0]), 6)
    0.841345
    """
    if backend_name() != "jax" or not _RATIONAL_ERF_UNDER_JAX:
        return ops.gelu(x, approximate=False)
    return _rational_gelu()(ops.convert_to_tensor(x))


def _polynomial(coefficients, t):
    """`Σ coefficients[i]·tⁱ`, by Horner's rule."""
    value = coefficients[-1]
    for coefficient in coefficients[-2::-1]:
        value = value * t + coefficient
    return value


def _normal_cdf(x):
    """Φ(x) = (1 + erf(x/√2))/2 of a float32 `x`, erf by the rational
    approximation."""
    z = ops.clip(x * (1.0 / math.sqrt(2.0)), -ERF_BOUND, ERF_BOUND)
    t = z * z
    erf = z * _polynomial(ERF_NUMERATOR, t) / _polynomial(ERF_DENOMINATOR, t)
    erf = ops.where(ops.abs(z) >= ERF_BOUND, ops.sign(z), erf)
    return 0.5 * (1.0 + erf)


@functools.cache
def _rational_gelu():
    """The JAX function x ↦ x·Φ(x) with its custom JVP."""
    import jax

    @jax.custom_jvp
    def gelu(x):
        x32 = ops.cast(x, "float32")
        return ops.cast(x32 * _normal_cdf(x32), x.dtype)

    @gelu.defjvp
    def gelu_jvp(primals, tangents):
        (x,), (tangent,) = primals, tangents
        x32 = ops.cast(x, "float32")
        cdf = _normal_cdf(x32)
        slope = cdf + x32 * ops.exp(-0.5 * x32 * x32) * (1.0 / math.sqrt(2.0 * math.pi))
        return ops.cast(x32 * cdf, x.dtype), ops.cast(slope * ops.cast(tangent, "float32"), x.dtype)

    return gelu
