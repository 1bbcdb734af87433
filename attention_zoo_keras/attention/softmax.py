"""Scaled dot-product (softmax) attention — Vaswani et al., 2017,
"Attention Is All You Need", eq. 1:

    Attention(Q, K, V) = softmax(Q Kᵀ / √d_k + M) V

where `M` is 0 where a query may attend to a key and −∞ where it may not
(padding, or the future under a causal mask).

When attention dropout is inactive this calls `keras.ops.dot_product_attention`,
which each backend implements with its fused kernel (`jax.nn.dot_product_attention`,
`torch.nn.functional.scaled_dot_product_attention`, flash attention on GPU for
half precision): causal self-attention without a mask uses the kernel's own
causal mode, and masks are shaped so that the fused kernel accepts them
(`backend_support.mask_for_fused_attention`; checked on an H100 in
`benchmarks/gpu_attention_benchmark.py`). Training with attention dropout uses PyTorch's fused kernel
with dropout on torch; JAX and TensorFlow have none, so there the explicit
einsum path computes the probabilities and drops them out.

Incremental decoding keeps a key/value cache (`KeyValueCache`, registered
as the "softmax" decoding): the keys and values of every position, new
queries attending over all of them.
"""

import math

from keras import ops
from keras import random

from attention_zoo_keras import backend_support
from attention_zoo_keras.attention.registry import DecodingCache
from attention_zoo_keras.attention.registry import register_decoding
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
    fused = not (training and dropout_rate > 0.0)
    if fused and attention_mask is None and is_causal and query.shape[1] is not None and query.shape[1] == key.shape[1]:
        # The kernels' own causal mode (FlashAttention on torch, cuDNN's
        # causal attention on JAX) rather than a boolean mask they must read.
        return ops.dot_product_attention(query, key, value, scale=scale, is_causal=True)
    mask = _combined_mask(attention_mask, is_causal, query_length, key_length)
    if mask is not None:
        mask = ops.cast(mask, "bool")
    if fused:
        mask = backend_support.mask_for_fused_attention(mask, query_length, key_length)
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


class KeyValueCache(DecodingCache):
    """Incremental decoding with a key/value cache (position-addressed).

    The cache holds the keys and values of every position, `K` and `V`
    `(batch, max_length, num_heads, head_dim)` each. A call writes the new
    positions' keys and values at `t0 = cache_update_index` and lets the
    new queries, at absolute positions `t0 … t0 + T − 1`, attend over the
    whole cache:

        K[:, t0 : t0 + T] ← K_new,   V[:, t0 : t0 + T] ← V_new
        output = attend(Q_new, K, V, mask = attention_mask ∧ [j ≤ t0 + i], query_offset = t0)

    (the causal part only with `is_causal`). Positions not yet written are
    zeros, kept out by the causal mask. Memory per layer grows with
    `max_length`; time per new token with the positions attended over.

    Args:
        attend: `attend(query, key_cache, value_cache, attention_mask,
            query_offset, is_causal, dropout_rate=, training=,
            seed_generator=, **arguments)`, the attention of queries at
            absolute positions `query_offset …` over the whole cache, under
            `attention_mask` (causality already in it; `is_causal` tells a
            mechanism with a positional pattern which pattern to use).
            `attend_over_cache(mechanism)` makes one for a mechanism that
            takes any boolean mask and no positions (softmax, additive).

    Example:

    >>> import numpy as np
    >>> decoding = KeyValueCache(attend_over_cache(softmax_attention))
    >>> cache = decoding.initial_cache(1, 6, num_heads=2, head_dim=4, dtype="float32")
    >>> x = np.random.rand(1, 1, 2, 4).astype("float32")
    >>> out, (key_cache, value_cache) = decoding.attend_with_cache(x, x, x, cache, 0)
    >>> tuple(out.shape), tuple(key_cache.shape)
    ((1, 1, 2, 4), (1, 6, 2, 4))
    """

    position_addressed = True

    def __init__(self, attend):
        self.attend = attend

    def initial_cache(self, batch, max_length, num_heads, head_dim, dtype, **options):
        """Zero `(key_cache, value_cache)`, each `(batch, max_length,
        num_heads, head_dim)` in `dtype`; the options do not change it."""
        del options
        shape = (batch, max_length, num_heads, head_dim)
        return ops.zeros(shape, dtype=dtype), ops.zeros(shape, dtype=dtype)

    def attend_with_cache(
        self,
        query,
        key,
        value,
        cache,
        cache_update_index,
        attention_mask=None,
        is_causal=True,
        dropout_rate=0.0,
        training=False,
        seed_generator=None,
        **arguments,
    ):
        """Writes the new keys and values, then attends over the cache; see
        `DecodingCache.attend_with_cache`."""
        key_cache, value_cache = cache
        key_cache = backend_support.write_rows(key_cache, cache_update_index, ops.cast(key, key_cache.dtype))
        value_cache = backend_support.write_rows(value_cache, cache_update_index, ops.cast(value, value_cache.dtype))
        mask = None if attention_mask is None else ops.cast(attention_mask, "bool")
        if is_causal:
            query_length, max_length = ops.shape(query)[1], ops.shape(key_cache)[1]
            causal = causal_mask(query_length, max_length, offset=cache_update_index)[None, None, :, :]
            mask = causal if mask is None else ops.logical_and(mask, causal)
        output = self.attend(
            query,
            key_cache,
            value_cache,
            mask,
            cache_update_index,
            is_causal,
            dropout_rate=dropout_rate,
            training=training,
            seed_generator=seed_generator,
            **arguments,
        )
        return output, (key_cache, value_cache)


def attend_over_cache(mechanism):
    """The `attend` of a `KeyValueCache` for a mechanism that takes any
    boolean (query, key) mask and needs no positions: the mechanism itself,
    its causality carried by the mask."""

    def attend(query, key_cache, value_cache, attention_mask, query_offset, is_causal, **arguments):
        del query_offset, is_causal  # in the mask
        return mechanism(query, key_cache, value_cache, attention_mask=attention_mask, is_causal=False, **arguments)

    return attend


register_decoding("softmax", KeyValueCache(attend_over_cache(softmax_attention)))
