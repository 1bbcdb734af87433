"""Gradients of attention on the active backend: `dense_attention` (dense
softmax attention in `keras.ops`, differentiable on every backend) and
`gradients` (of a function's weighted sum with respect to its inputs): the
reference that the local and sparse mechanisms' gradients are checked against."""

import keras
import numpy as np


def numpy(x):
    return keras.ops.convert_to_numpy(x)


def dense_attention(query, key, value, mask):
    """softmax(QKᵀ/√d + M)V in keras.ops (differentiable on every backend)."""
    ops = keras.ops
    logits = ops.einsum("btnh,bsnh->bnts", query, key) / np.sqrt(query.shape[-1]).astype("float32")
    logits = ops.where(mask, logits, -1e9)
    return ops.einsum("bnts,bsnh->btnh", ops.softmax(logits, axis=-1), value)


def gradients(function, inputs):
    """d sum(function(*inputs) * weights) / d inputs (each of them), on the
    active backend."""
    backend = keras.backend.backend()
    weights = np.random.default_rng(1).standard_normal(numpy(function(*inputs)).shape).astype("float32")
    if backend == "jax":
        import jax

        return jax.grad(lambda *xs: (function(*xs) * weights).sum(), argnums=tuple(range(len(inputs))))(*inputs)
    if backend == "tensorflow":
        import tensorflow as tf

        tensors = [tf.constant(x) for x in inputs]
        with tf.GradientTape() as tape:
            tape.watch(tensors)
            loss = tf.reduce_sum(function(*tensors) * weights)
        return tape.gradient(loss, tensors)
    import torch

    tensors = [torch.tensor(x, requires_grad=True) for x in inputs]
    (function(*tensors) * torch.tensor(weights)).sum().backward()
    return [t.grad for t in tensors]
