"""A dense projection and a layer normalization, each as the backend's one
fused kernel.

Keras computes `Dense` as `matmul(x, W)` then `add(·, b)` and
`LayerNormalization` in float32 with casts around it. Under torch on a GPU
that costs a second pass per projection and two per normalization: the
bias add broadcasts `b`, which torch's element-wise kernels cannot
vectorise. In a BERT-base forward (bf16, batch 32 × 512, H200) those adds
took 3.4 of 12.9 ms of kernel time and the float32 normalizations with
their casts another 2.8 ms (`benchmarks/profile_bert_kernels.py`). torch's
`linear` adds the bias in the matrix product's epilogue (`addmm`), and its
`layer_norm` reads bfloat16 and accumulates in float32 itself, as
`transformers` computes them. JAX and TensorFlow compile the layers whole
(XLA fuses the add and the casts), so there the Keras ops run as they are,
with one exception: a projection of a single row under JAX on a GPU (see
`dense_projection`).
"""

from keras import ops

from attention_zoo_keras.backend_support.environment import backend_name
from attention_zoo_keras.backend_support.environment import jax_compiles_for_gpu


# Whether a single row's projection under JAX on a GPU is computed as two
# rows (see `dense_projection`).
_SINGLE_ROWS_AS_TWO_ON_GPU = True


def dense_projection(x, kernel, bias):
    """`x @ kernel + bias` (`bias` may be `None`), or `None` where the
    caller computes it the Keras way:

    * torch: one `linear` call when the three share a dtype;
    * JAX on a GPU, for a single row (every projection of a batch-of-one
      decoding step): the row and a row of zeros, multiplied as two, the
      first kept. XLA rewrites a vector-by-matrix product with fewer than
      10 million weights as a multiply-and-reduce fusion, which reads the
      weights far below the memory bandwidth cuBLAS reaches with a matrix
      of two rows (GPT-2 small, H200: a batch-of-one `generate` call took
      longer than a batch of eight);
    * elsewhere `None`.
    """
    if backend_name() == "jax":
        return _single_row_as_two(x, kernel, bias)
    if backend_name() != "torch":
        return None
    import torch

    x, kernel = ops.convert_to_tensor(x), ops.convert_to_tensor(kernel)  # a variable's (autocast) value
    bias = None if bias is None else ops.convert_to_tensor(bias)
    if kernel.dtype != x.dtype or (bias is not None and bias.dtype != x.dtype):
        return None
    return torch.nn.functional.linear(x, kernel.T, bias)


def _single_row_as_two(x, kernel, bias):
    """`x @ kernel + bias` computed on `x` and a row of zeros, under JAX on
    a GPU when `x` is one row `(1, …, 1, d)`; else `None`."""
    if not _SINGLE_ROWS_AS_TWO_ON_GPU or any(size != 1 for size in x.shape[:-1]) or not jax_compiles_for_gpu():
        return None
    rows = ops.reshape(x, (1, x.shape[-1]))
    outputs = ops.matmul(ops.concatenate([rows, ops.zeros_like(rows)], axis=0), kernel)[:1]
    if bias is not None:
        outputs = outputs + bias
    return ops.reshape(outputs, tuple(x.shape[:-1]) + (kernel.shape[-1],))


def layer_normalization(x, gamma, beta, epsilon):
    """`(x − mean) / sqrt(var + epsilon) · gamma + beta` over the last axis;
    under torch one `layer_norm` call in `x`'s dtype when `gamma` and `beta`
    share it, else `None` (the caller computes it the Keras way)."""
    if backend_name() != "torch":
        return None
    import torch

    x, gamma, beta = (ops.convert_to_tensor(t) for t in (x, gamma, beta))
    if gamma.dtype != x.dtype or beta.dtype != x.dtype:
        return None
    # The normalized shape is the weights' (static), not read off `x`: a size
    # taken from a traced `x` is symbolic, which torch's ONNX export refuses.
    return torch.nn.functional.layer_norm(x, tuple(gamma.shape), gamma, beta, epsilon)
