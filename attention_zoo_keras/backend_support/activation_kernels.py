"""The exact GELU, in the form each backend computes fastest.

GELU (Hendrycks & Gimpel, 2016) is x·Φ(x) = x·(1 + erf(x/√2))/2. JAX's
`jax.nn.gelu(approximate=False)`, which `keras.ops.gelu` calls, writes Φ
with `erfc`, and XLA expands float32 `erfc` into both of its branches for
every element (a polynomial for small |x|; for large |x| an exponential
times a rational function, with three divisions), where `erf` is one
rational polynomial. In BERT-base's forward on an H200 (bf16, batch 32 ×
128) the `erfc` GELU was the costliest fusion, 458 µs of 2.5 ms of kernel
time, plus 191 µs for a separate pass that wrote −x/√2 to memory for it
(`benchmarks/profile_jax_gpu.py --dump-hlo`); on a 2-core CPU the `erf`
form takes 2.1 ms against 4.8 ms for a 1024 × 3072 bf16 tensor. torch's
`gelu` is one fused kernel and TensorFlow was not measured: they keep
`keras.ops.gelu`.
"""

import math

import keras
from keras import ops

from attention_zoo_keras.backend_support.environment import backend_name


def exact_gelu(x):
    """x·Φ(x), computed in float32 for 16-bit `x` and returned in `x`'s
    dtype; within 1.1e-6 of the float64 function in float32.

    Example:

    >>> y = exact_gelu(ops.convert_to_tensor([-1.0, 0.0, 2.0]))
    >>> [round(float(v), 4) for v in ops.convert_to_numpy(y)]
    [-0.1587, 0.0, 1.9545]
    """
    if backend_name() != "jax":
        return ops.gelu(x, approximate=False)
    dtype = keras.backend.standardize_dtype(x.dtype)
    wide = ops.cast(x, "float32") if dtype in ("bfloat16", "float16") else x
    return ops.cast(wide * (1.0 + ops.erf(wide * (1.0 / math.sqrt(2.0)))) * 0.5, dtype)
