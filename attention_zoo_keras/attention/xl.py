"""Transformer-XL relative attention — Dai, Yang, Yang, Carbonell, Le and
Salakhutdinov, 2019, "Transformer-XL: Attentive Language Models Beyond a
Fixed-Length Context" (ACL 2019), §3.3, with segment-level recurrence (§3.2).

The keys and values cover the cached memory of the previous segment
followed by the current segment; the queries only the current segment.
Query i (absolute position m + i, where m is the memory length) and key j
score

    A_ij = (q_i + u) · k_j  +  (q_i + v) · r_{i−j+m}
            (a) + (c)            (b) + (d)

where `r_d = W_R R_d` is the sinusoidal encoding of the distance d
projected by the layer (`position_keys`), `u` the content bias and `v` the
position bias, each `(num_heads, head_dim)` (per layer, or shared by all
layers). Distances beyond `clamp_len` use `R_{clamp_len}` (the caller builds
the table that way). Then, as usual,

    α_ij = softmax_j(A_ij / √d + M_ij),   out_i = Σ_j α_ij v_j

with `M` masking what query i may not see: later keys (causal across the
memory), and with `same_length` keys more than `span − 1` positions back, so
that every query attends to the same number of keys (`xl_attention_mask`).

**The relative shift.** The position term is computed for every (query,
distance) pair, `B_id = (q_i + v) · r_d` for the `S` distances `S − 1 … 0`,
`(T, S)`, then moved into place by padding a zero column on the left,
reshaping `(T, S + 1)` to `(S + 1, T)` and dropping the first row (the
authors' `_rel_shift`): every entry lands at `B[i, j] = B_{i, m+i−j}` for
`j ≤ m + i`, in O(T·S) memory and no gather. Entries for `j > m + i` are
garbage and must be masked, so the shift serves causal attention. Where it
does not apply — an offset query (decoding into a key/value cache), a
distance table that is not exactly one row per key, or no causal mask — the
position term is gathered by distance instead.
"""

import math

from keras import ops
from keras import random

from attention_zoo_keras.attention.decoding import KeyValueCache
from attention_zoo_keras.attention.masks import causal_mask
from attention_zoo_keras.attention.masks import masked_logit
from attention_zoo_keras.attention.masks import relative_distances
from attention_zoo_keras.attention.masks import softmax_last_axis
from attention_zoo_keras.attention.registry import register_decoding
from attention_zoo_keras.attention.registry import register_mechanism


def xl_attention_mask(query_length, key_length, attention_span=None, query_offset=None):
    """Boolean `(query_length, key_length)`, `True` where query i may attend key j.

    Query i sits at absolute position `p = query_offset + i` (default
    `key_length − query_length`, the memory length), key j at `j`. Query i
    sees keys `p − attention_span < j ≤ p`: causal across the memory, and
    with `attention_span` (Transformer-XL's `same_length`, span = `mem_len`)
    no further back than the span, so every query attends to the same number
    of keys. `None` leaves only the causal limit.

    Example:

    >>> import keras
    >>> keras.ops.convert_to_numpy(xl_attention_mask(2, 4, attention_span=2)).astype(int).tolist()
    [[0, 1, 1, 0], [0, 0, 1, 1]]
    """
    if query_offset is None:
        query_offset = key_length - query_length
    mask = causal_mask(query_length, key_length, query_offset)
    if attention_span is not None:
        mask = ops.logical_and(mask, relative_distances(query_length, key_length, query_offset) > -attention_span)
    return mask


def relative_shift(position_logits):
    """The Transformer-XL shift: `(B, N, T, S)` scores by distance, column c
    for distance `S − 1 − c`, to scores by key, `out[..., i, j] = in[..., i,
    j + T − 1 − i]` for `j ≤ S − T + i` (later entries are garbage, to be
    masked). Pads a zero column on the left, reshapes `(T, S + 1)` to
    `(S + 1, T)` and drops the first row."""
    batch, heads, query_length, key_length = ops.shape(position_logits)
    padded = ops.pad(position_logits, [(0, 0), (0, 0), (0, 0), (1, 0)])
    padded = ops.reshape(padded, (batch, heads, key_length + 1, query_length))
    return ops.reshape(padded[:, :, 1:, :], (batch, heads, query_length, key_length))


def _gathered_position_logits(position_query, position_keys, key_length, query_offset):
    """`(B, N, T, S)`: `(q_i + v) · r_{clip(p_i − j)}` by gathering rows of
    the `(R, N, H)` distance table (row d for distance d, the last row for
    all longer ones)."""
    by_distance = ops.einsum("btnh,rnh->bntr", position_query, position_keys)
    distances = -relative_distances(ops.shape(position_query)[1], key_length, query_offset)
    rows = ops.clip(distances, 0, ops.shape(position_keys)[0] - 1)
    return ops.take_along_axis(by_distance, rows[None, None, :, :], axis=-1)


def xl_weights(num_heads, head_dim, per_layer_biases=True):
    """The content and position biases u and v, `(num_heads, head_dim)`
    each, zero-initialised — unless they are shared by all layers
    (`per_layer_biases=False`, the authors' `untie_r` off), then the model
    owns them and passes them with every call."""
    if not per_layer_biases:
        return {}
    return {
        "content_bias": ((num_heads, head_dim), "zeros"),
        "position_bias": ((num_heads, head_dim), "zeros"),
    }


@register_mechanism("xl", weights=xl_weights, inputs=("position_keys",))
def xl_attention(
    query,
    key,
    value,
    attention_mask=None,
    is_causal=True,
    dropout_rate=0.0,
    training=False,
    seed_generator=None,
    position_keys=None,
    content_bias=None,
    position_bias=None,
    query_offset=None,
):
    """Transformer-XL attention over `(batch, length, num_heads, head_dim)`
    tensors whose keys and values are `[memory; segment]`.

    Args:
        query: tensor of shape `(B, T, N, H)`. The queries, the current
            segment.
        key: tensor of shape `(B, S, N, H)`. The keys, memory then segment
            (`S = m + T`).
        value: tensor of shape `(B, S, N, M)`. The values, the same
            positions; `M` may differ from `H`.
        attention_mask: bool tensor or None. Broadcastable to `(B, N, T, S)`;
            `True` attends (e.g. `xl_attention_mask` for `same_length`).
        is_causal: bool. Also forbid keys after the query's position. The
            table holds no negative distances: without causality, later
            keys are scored as distance 0.
        dropout_rate: float. Dropout on the attention probabilities while
            training.
        training: bool. Whether dropout is active.
        seed_generator: `keras.random.SeedGenerator` or None. The dropout's
            seed generator.
        position_keys: tensor of shape `(R, N, H)`. The projected encodings
            of distances `0 … R − 1` (row d for distance d; longer distances
            use the last row); with `R = S` and no `query_offset` the
            relative shift applies.
        content_bias: tensor of shape `(N, H)`. u.
        position_bias: tensor of shape `(N, H)`. v.
        query_offset: int, int32 scalar tensor or None. Absolute position of
            the first query; `None`: `S − T` (the last query is aligned with
            the last key).

    Returns:
        `(B, T, N, M)`.

    Example:

    >>> import numpy as np
    >>> q = np.random.rand(1, 2, 2, 4).astype("float32")
    >>> kv = np.random.rand(1, 5, 2, 4).astype("float32")
    >>> r = np.random.rand(5, 2, 4).astype("float32")
    >>> b = np.zeros((2, 4), "float32")
    >>> tuple(xl_attention(q, kv, kv, position_keys=r, content_bias=b, position_bias=b).shape)
    (1, 2, 2, 4)
    """
    if position_keys is None or content_bias is None or position_bias is None:
        raise ValueError("Transformer-XL attention needs position_keys, content_bias and position_bias.")
    query, key, value = (ops.convert_to_tensor(x) for x in (query, key, value))
    query_length, key_length = ops.shape(query)[1], ops.shape(key)[1]
    dtype = query.dtype
    content_logits = ops.einsum("btnh,bsnh->bnts", query + ops.cast(content_bias, dtype), key)
    position_query = query + ops.cast(position_bias, dtype)
    position_keys = ops.cast(position_keys, dtype)
    shift_applies = (
        is_causal and query_offset is None
        and position_keys.shape[0] is not None and position_keys.shape[0] == key.shape[1]
    )
    if shift_applies:
        by_distance = ops.einsum("btnh,rnh->bntr", position_query, ops.flip(position_keys, axis=0))
        position_logits = relative_shift(by_distance)
    else:
        offset = key_length - query_length if query_offset is None else query_offset
        position_logits = _gathered_position_logits(position_query, position_keys, key_length, offset)
    logits = (content_logits + position_logits) * ops.cast(1.0 / math.sqrt(query.shape[-1]), dtype)

    mask = None if attention_mask is None else ops.cast(attention_mask, "bool")
    if is_causal:
        causal = causal_mask(query_length, key_length, query_offset)
        mask = causal if mask is None else ops.logical_and(mask, causal)
    if mask is not None:
        logits = ops.where(mask, logits, masked_logit(logits.dtype))
    probabilities = ops.cast(softmax_last_axis(ops.cast(logits, "float32")), dtype)
    if training and dropout_rate > 0.0:
        probabilities = random.dropout(probabilities, dropout_rate, seed=seed_generator)
    return ops.einsum("bnts,bsnh->btnh", probabilities, value)


def _attend_over_cache(query, key_cache, value_cache, attention_mask, query_offset, is_causal, **arguments):
    """Queries at `query_offset …` over a key/value cache: the position term
    by distance (gathered), causality already in the mask."""
    del is_causal
    return xl_attention(
        query, key_cache, value_cache, attention_mask=attention_mask, is_causal=False,
        query_offset=query_offset, **arguments,
    )


# Keys and values carry no position in Transformer-XL (positions enter only
# through the query-side term), so the memory of a decoding model is kept as
# its projected keys and values: a key/value cache.
register_decoding("xl", KeyValueCache(_attend_over_cache))
