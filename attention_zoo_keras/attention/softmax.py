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
`benchmarks/gpu_attention_benchmark.py`); under JAX on a GPU cuDNN is also
given each row's key length, so it skips the keys after the last one the
mask lets a row see (`backend_support.fused_dot_product_attention`), and
given only the lengths where the caller passes `key_lengths` instead of a
mask (right-padded rows: `layers.padding_last_order`). Training with
attention dropout uses PyTorch's fused kernel with dropout on torch; JAX
and TensorFlow have none, so there the explicit einsum path computes the
probabilities and drops them out.

Incremental decoding keeps a key/value cache (`decoding.KeyValueCache`,
registered as the "softmax" decoding): the keys and values of every
position, new queries attending over all of them.
"""

import math

from keras import ops
from keras import random

from attention_zoo_keras import backend_support
from attention_zoo_keras.attention.decoding import KeyValueCache
from attention_zoo_keras.attention.decoding import attend_over_cache
from attention_zoo_keras.attention.masks import causal_mask
from attention_zoo_keras.attention.masks import key_length_mask
from attention_zoo_keras.attention.masks import masked_logit
from attention_zoo_keras.attention.masks import softmax_last_axis
from attention_zoo_keras.attention.registry import register_decoding
from attention_zoo_keras.attention.registry import register_mechanism


def _combined_mask(attention_mask, is_causal, query_length, key_length):
    if not is_causal:
        return attention_mask
    causal = causal_mask(query_length, key_length)
    return causal if attention_mask is None else ops.logical_and(attention_mask, causal)


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
    key_lengths=None,
):
    """Softmax attention over `(batch, length, num_heads, head_dim)` tensors.

    Args:
        query: tensor of shape `(B, T, N, H)`. The queries.
        key: tensor of shape `(B, S, N, H)`. The keys.
        value: tensor of shape `(B, S, N, M)`. The values; the value head
            size `M` may differ from `H`.
        attention_mask: bool tensor or None. Broadcastable to `(B, N, T, S)`;
            `True` attends.
        is_causal: bool. Also forbid attending to later positions.
        dropout_rate: float. Dropout on the attention probabilities while
            training.
        training: bool. Whether dropout is active.
        seed_generator: `keras.random.SeedGenerator` or None. The dropout's
            seed generator.
        scale: float or None. The logit scale; `None`: `1 / sqrt(H)`.
        key_lengths: int tensor `(B,)` or None. Instead of
            `attention_mask`: row b's queries see its first
            `key_lengths[b]` keys (right-padded rows, e.g. after
            `layers.padding_last_order`), which the fused kernel under JAX
            on a GPU takes without reading a mask.

    Returns:
        `(B, T, N, M)`.

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
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])
    dropout_rate = dropout_rate if training else 0.0
    lengths = None
    if key_lengths is not None:
        if attention_mask is not None:
            raise ValueError("Pass attention_mask or key_lengths, not both.")
        attention_mask = key_length_mask(key_lengths, key_length)
        lengths = None if is_causal else ops.cast(key_lengths, "int32")
    # Causal self-attention: the kernels' own causal mode (FlashAttention on
    # torch, cuDNN's causal attention on JAX) rather than a mask they must read.
    own_causal_mode = (
        attention_mask is None and is_causal and query.shape[1] is not None and query.shape[1] == key.shape[1]
    )
    mask = None if own_causal_mode else _combined_mask(attention_mask, is_causal, query_length, key_length)
    if mask is not None:
        mask = ops.cast(mask, "bool")
    native = backend_support.native_fused_attention()
    if native is not None:  # torch: dropout inside the kernel, strided inputs read in place
        return native(query, key, value, mask, scale, dropout_rate, is_causal=own_causal_mode)
    if dropout_rate == 0.0:
        mask = backend_support.mask_for_fused_attention(mask, query_length, key_length)
        return _fused_attention(query, key, value, scale, mask=mask, is_causal=own_causal_mode, lengths=lengths)
    logits = ops.einsum("btnh,bsnh->bnts", query, key) * ops.cast(scale, query.dtype)
    if mask is not None:
        logits = ops.where(mask, logits, masked_logit(logits.dtype))
    probabilities = softmax_last_axis(logits)
    probabilities = random.dropout(probabilities, dropout_rate, seed=seed_generator)
    return ops.einsum("bnts,bsnh->btnh", probabilities, value)


def _fused_attention(query, key, value, scale, mask=None, is_causal=False, lengths=None):
    """`keras.ops.dot_product_attention` (through
    `backend_support.fused_dot_product_attention`), also for a value head size `M`
    other than the query's `D`.

    JAX's kernel requires `M = D` (torch's and TensorFlow's do not), so the
    narrower side is zero-padded: zero columns of the query and key add
    nothing to the logits (`scale` is already fixed at the caller's), zero
    columns of the value give zero output columns, which are cut off.
    """
    depth, value_depth = query.shape[-1], value.shape[-1]
    if depth < value_depth:
        widths = [[0, 0]] * (len(query.shape) - 1) + [[0, value_depth - depth]]
        query, key = ops.pad(query, widths), ops.pad(key, widths)
    elif value_depth < depth:
        value = ops.pad(value, [[0, 0]] * (len(value.shape) - 1) + [[0, depth - value_depth]])
    output = backend_support.fused_dot_product_attention(
        query, key, value, mask, scale, is_causal=is_causal, lengths=lengths
    )
    return output if value_depth >= depth else output[..., :value_depth]


register_decoding("softmax", KeyValueCache(attend_over_cache(softmax_attention)))
