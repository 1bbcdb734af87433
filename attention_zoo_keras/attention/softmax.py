"""Scaled dot-product (softmax) attention — Vaswani et al., 2017,
"Attention Is All You Need", eq. 1:

    Attention(Q, K, V) = softmax(Q Kᵀ / √d_k + M) V

where `M` is 0 where a query may attend to a key and −∞ where it may not
(padding, or the future under a causal mask).

When attention dropout is inactive this calls `keras.ops.dot_product_attention`,
which each backend implements with its fused kernel (`jax.nn.dot_product_attention`,
`torch.nn.functional.scaled_dot_product_attention`, flash attention on GPU for
half precision). Training with attention dropout uses PyTorch's fused kernel
with dropout on torch; JAX and TensorFlow have none, so there the explicit
einsum path computes the probabilities and drops them out.
"""

import math

from keras import ops
from keras import random

from attention_zoo_keras import backend_support
from attention_zoo_keras.attention.registry import register_mechanism


def causal_mask(query_length, key_length, offset=None):
    """Boolean `(query_length, key_length)`: query i sees keys j ≤ i + offset.

    `offset` is the absolute position of the first query. It defaults to
    `key_length − query_length`, aligning the last query with the last key;
    decoding into a fixed-size key/value cache passes the write position.
    """
    if offset is None:
        offset = key_length - query_length
    query_positions = ops.arange(query_length)[:, None] + offset
    key_positions = ops.arange(key_length)[None, :]
    return query_positions >= key_positions


def _combined_mask(attention_mask, is_causal, query_length, key_length):
    if not is_causal:
        return attention_mask
    causal = causal_mask(query_length, key_length)
    return causal if attention_mask is None else ops.logical_and(attention_mask, causal)


def _masked_logit(dtype):
    """A logit that vanishes under softmax yet keeps fully masked rows finite."""
    return ops.cast(-3e4 if dtype == "float16" else -1e9, dtype)


@register_mechanism("softmax")
def softmax_attention(
    query,
    key,
    value,
    attention_mask=None,
    is_causal=False,
    dropout_rate=0.0,
    training=False,
    seed_generator=None,
    scale=None,
):
    """Softmax attention over `(batch, length, num_heads, head_dim)` tensors.

    Args:
        query: `(B, T, N, H)`.
        key: `(B, S, N, H)`.
        value: `(B, S, N, H)`.
        attention_mask: boolean, broadcastable to `(B, N, T, S)`; `True` attends.
        is_causal: also forbid attending to later positions.
        dropout_rate: dropout on the attention probabilities while training.
        training: whether dropout is active.
        seed_generator: a `keras.random.SeedGenerator` for the dropout.
        scale: logit scale; defaults to `1 / sqrt(H)`.

    Returns:
        `(B, T, N, H)`.

    Example:

    >>> import numpy as np
    >>> q = np.random.rand(2, 5, 4, 8).astype("float32")
    >>> tuple(softmax_attention(q, q, q, is_causal=True).shape)
    (2, 5, 4, 8)
    """
    query_length, key_length = query.shape[1], key.shape[1]
    if query_length is None:
        query_length = ops.shape(query)[1]
    if key_length is None:
        key_length = ops.shape(key)[1]
    mask = _combined_mask(attention_mask, is_causal, query_length, key_length)
    if mask is not None:
        mask = ops.cast(mask, "bool")
    if not (training and dropout_rate > 0.0):
        return ops.dot_product_attention(query, key, value, mask=mask, scale=scale)
    fused_with_dropout = backend_support.fused_attention_with_dropout()
    if fused_with_dropout is not None:
        return fused_with_dropout(query, key, value, mask, scale, dropout_rate)

    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])
    logits = ops.einsum("btnh,bsnh->bnts", query, key) * ops.cast(scale, query.dtype)
    if mask is not None:
        logits = ops.where(mask, logits, _masked_logit(logits.dtype))
    probabilities = ops.softmax(logits, axis=-1)
    probabilities = random.dropout(probabilities, dropout_rate, seed=seed_generator)
    return ops.einsum("bnts,bsnh->btnh", probabilities, value)
