"""Relative position attention — Shaw, Uszkoreit and Vaswani, 2018,
"Self-Attention with Relative Position Representations" (NAACL 2018),
eqs. 3–5; with the memory-efficient "skew" of Huang et al., 2019, "Music
Transformer" (ICLR 2019), §3.4.1.

Each (query, key) pair gets learned embeddings of their clipped distance:

    a^K_ij = w^K_{clip(j − i, −k, k)},   a^V_ij = w^V_{clip(j − i, −k, k)}
    e_ij   = (q_i · k_j + q_i · a^K_ij) / √d
    α_ij   = softmax_j(e_ij + M_ij)
    out_i  = Σ_j α_ij (v_j + a^V_ij)          (the a^V term is optional)

with tables of `2k + 1` rows shared by all heads or one per head. Computed
without an L×L×d tensor: O(L·min(k, L)) extra memory per batch and head (a
gather), and under a causal mask Music Transformer's skew, O(L·d).

`docs/attention/relative.md` holds the whole description: the gather and
skew paths, positions and query offsets, dropout.
"""

import math

import keras
from keras import ops
from keras import random

from attention_zoo_keras.attention.blocks import axis_size
from attention_zoo_keras.attention.decoding import KeyValueCache
from attention_zoo_keras.attention.masks import causal_mask
from attention_zoo_keras.attention.masks import masked_logit
from attention_zoo_keras.attention.masks import relative_distances
from attention_zoo_keras.attention.masks import softmax_last_axis
from attention_zoo_keras.attention.registry import register_decoding
from attention_zoo_keras.attention.registry import register_mechanism


def _check_table(table, name, num_heads, head_dim, sized_by="query"):
    """Validates a relative-embedding table whose width must be `head_dim`,
    the head size of `sized_by` (the query for w^K, the value for w^V);
    returns its number of rows."""
    rank = len(table.shape)
    if rank not in (2, 3):
        raise ValueError(
            f"{name} must be (num_distances, head_dim) shared by all heads or "
            f"(num_heads, num_distances, head_dim) per head; got shape {tuple(table.shape)}."
        )
    if table.shape[-1] is not None and head_dim is not None and table.shape[-1] != head_dim:
        raise ValueError(f"{name} has head_dim {table.shape[-1]}, the {sized_by} has {head_dim}.")
    if rank == 3 and table.shape[0] is not None and num_heads is not None and table.shape[0] != num_heads:
        raise ValueError(f"{name} has {table.shape[0]} heads, the query has {num_heads}.")
    return table.shape[-2]


def _times_table(query, table):
    """`q · wᵀ` for every row of `table`: `(B, T, N, H)` → `(B, N, T, rows)`."""
    if len(table.shape) == 2:
        return ops.einsum("btnh,rh->bntr", query, table)
    return ops.einsum("btnh,nrh->bntr", query, table)


def relative_position_indices(query_length, key_length, max_distance, query_offset=None):
    """Row of the relative table for each (query, key): `clip(j − i, −k, k) + k`.

    Args:
        query_length: int or int32 scalar tensor. T.
        key_length: int or int32 scalar tensor. S.
        max_distance: int. The clipping distance k.
        query_offset: int, int32 scalar tensor or None. Absolute position of
            the first query; `None`: `key_length − query_length`.

    Returns:
        int32 `(T, S)` with values in `[0, 2k]`.

    Example:

    >>> import keras
    >>> keras.ops.convert_to_numpy(relative_position_indices(3, 3, 1)).tolist()
    [[1, 2, 2], [0, 1, 2], [0, 0, 1]]
    """
    if query_offset is None:
        query_offset = key_length - query_length
    distances = relative_distances(query_length, key_length, query_offset)
    return ops.clip(distances, -max_distance, max_distance) + max_distance


def skewed_relative_logits(query, relative_embeddings):
    """Music Transformer's skew: causal relative logits in O(L·d) extra memory.

    `S_rel[b, n, i, j] = q_i · E_r[j − i + L − 1]` for `j ≤ i`, computed from
    `Q E_rᵀ` by padding one column on the left, reshaping `(L, L + 1)` to
    `(L + 1, L)` and dropping the first row (Huang et al., 2019, §3.4.1).

    Args:
        query: tensor of shape `(B, L, N, H)`. The queries.
        relative_embeddings: tensor of shape `(R, H)` or `(N, R, H)`. `E_r`,
            shared by all heads or per head, `R ≥ L`; the last row is
            distance 0 and row `r` is distance `r − (R − 1)`, so the last
            `L` rows are distances −(L−1)…0 (a `max_length`-row table serves
            any `L ≤ max_length`).

    Returns:
        `(B, N, L, L)`; entries above the diagonal (`j > i`, the future) are 0.

    Example:

    >>> import numpy as np
    >>> q = np.random.rand(2, 5, 4, 8).astype("float32")
    >>> tuple(skewed_relative_logits(q, np.random.rand(5, 8).astype("float32")).shape)
    (2, 4, 5, 5)
    """
    query = ops.convert_to_tensor(query)
    relative_embeddings = ops.convert_to_tensor(relative_embeddings, dtype=query.dtype)
    num_heads, head_dim = query.shape[2], query.shape[3]
    rows = _check_table(relative_embeddings, "relative_embeddings", num_heads, head_dim)
    length = axis_size(query)
    if isinstance(length, int) and rows is not None and rows < length:
        raise ValueError(
            f"relative_embeddings has {rows} distances; a query of length {length} needs at least {length}."
        )
    relative_embeddings = relative_embeddings[..., -length:, :] if rows != length else relative_embeddings
    batch = ops.shape(query)[0]
    logits = _times_table(query, relative_embeddings)  # (B, N, L, L): row i, column r ↔ q_i · E_r[r]
    logits = ops.pad(logits, [[0, 0], [0, 0], [0, 0], [1, 0]])  # (B, N, L, L + 1)
    logits = ops.reshape(logits, (batch, num_heads, length + 1, length))
    logits = logits[:, :, 1:, :]  # (B, N, L, L)
    # What lands above the diagonal is the next row's start: zero it.
    return ops.where(causal_mask(length, length, offset=0), logits, ops.zeros((), logits.dtype))


def _distance_window(query_length, key_length, query_offset, max_distance, is_causal):
    """`(lo, hi)`, the clipped distances that can occur, `−k ≤ lo ≤ hi ≤ k`.

    Only table rows `lo + k … hi + k` are used: a table longer than the
    sequence (a `max_length`-sized Music Transformer table on a short input)
    costs nothing, and under a causal mask positive distances are skipped.
    With lengths or offset unknown at trace time the window is the table.
    """
    lo, hi = -max_distance, max_distance
    if all(isinstance(n, int) for n in (query_length, key_length, query_offset)):
        nearest = -(query_length - 1 + query_offset)  # first key, last query
        farthest = key_length - 1 - query_offset  # last key, first query
        lo, hi = (min(max(d, -max_distance), max_distance) for d in (nearest, farthest))
    if is_causal:
        hi = max(lo, min(hi, 0))  # the future is masked: its logits are never used
    return lo, hi


def _gathered_relative_logits(query, table, key_length, window, max_distance, query_offset):
    """`q_i · w^K_{clip(j − i, −k, k)}` by a gather from `q · wᵀ`: `(B, N, T, S)`."""
    lo, hi = window
    rows = table[..., lo + max_distance : hi + max_distance + 1, :]
    per_distance = _times_table(query, rows)  # (B, N, T, hi − lo + 1)
    distances = relative_distances(axis_size(query), key_length, query_offset)
    indices = ops.clip(distances, lo, hi) - lo
    return ops.take_along_axis(per_distance, indices[None, None, :, :], axis=-1)


def _bucketed(probabilities, window, query_offset):
    """Σ_j α_ij over the keys j of each clipped distance: `(B, N, T, hi − lo + 1)`.

    Column r holds the probability mass at distance `lo + r`: the interior
    distances (lo < d < hi) are diagonals of α, picked by a gather; the two
    ends (d ≤ lo, d ≥ hi: the clipped ones) are masked row sums. Nothing
    L×L×k is built.
    """
    lo, hi = window
    if lo == hi:
        return ops.sum(probabilities, axis=-1, keepdims=True)
    query_length, key_length = axis_size(probabilities, 2), axis_size(probabilities, 3)
    zero = ops.zeros((), probabilities.dtype)
    distances = relative_distances(query_length, key_length, query_offset)  # (T, S)
    far_left = ops.sum(ops.where(distances <= lo, probabilities, zero), axis=-1, keepdims=True)
    far_right = ops.sum(ops.where(distances >= hi, probabilities, zero), axis=-1, keepdims=True)
    if hi - lo == 1:
        return ops.concatenate([far_left, far_right], axis=-1)
    # Interior: key j = position_i + d for d in lo + 1 … hi − 1.
    interior = ops.arange(lo + 1, hi, dtype="int32")
    query_positions = ops.arange(query_length, dtype="int32") + ops.cast(query_offset, "int32")
    keys = query_positions[:, None] + interior[None, :]  # (T, hi − lo − 1)
    inside = ops.logical_and(keys >= 0, keys < key_length)
    keys = ops.clip(keys, 0, key_length - 1)
    diagonals = ops.take_along_axis(probabilities, keys[None, None, :, :], axis=-1)
    diagonals = ops.where(inside, diagonals, zero)
    return ops.concatenate([far_left, diagonals, far_right], axis=-1)


def _value_term(buckets, table, window, max_distance):
    """Σ_j α_ij a^V_ij = Σ_r bucket_ir w^V_{lo + r}: `(B, N, T, hi − lo + 1)` → `(B, T, N, H)`."""
    lo, hi = window
    table = table[..., lo + max_distance : hi + max_distance + 1, :]
    if len(table.shape) == 2:
        return ops.einsum("bntr,rh->btnh", buckets, table)
    return ops.einsum("bntr,nrh->btnh", buckets, table)


def _max_distance_of(table, max_distance, name):
    rows = table.shape[-2]
    if rows is None:
        if max_distance is None:
            raise ValueError(f"The number of rows of {name} is unknown; pass max_distance.")
        return max_distance
    if rows % 2 != 1:
        raise ValueError(f"{name} must have 2·max_distance + 1 rows (an odd number); got {rows}.")
    if max_distance is not None and rows != 2 * max_distance + 1:
        raise ValueError(
            f"{name} has {rows} rows but max_distance={max_distance} needs 2·{max_distance} + 1 = "
            f"{2 * max_distance + 1}."
        )
    return (rows - 1) // 2


DEFAULT_MAX_DISTANCE = 16  # Shaw et al. (2018), §4: k = 16 in their experiments


def relative_attention_weights(
    num_heads, head_dim, max_distance=DEFAULT_MAX_DISTANCE, per_head=False, value_embeddings=True
):
    """The weights `relative_attention` takes, as `{argument name: (shape, initializer)}`.

    A layer creates one variable per entry and passes it under that name.
    Both tables are initialised N(0, head_dim^−1/2), as Music Transformer's
    tensor2tensor code does for its relative embeddings.

    Args:
        num_heads: int. The layer's number of heads.
        head_dim: int. The per-head size.
        max_distance: int. The clipping distance k (tables of 2k + 1 rows).
            For Music Transformer's unclipped attention, the longest
            sequence minus one.
        per_head: bool. One table per head (Music Transformer) instead of
            one shared by the heads (Shaw et al.).
        value_embeddings: bool. Whether to also learn the a^V table (Shaw et
            al.; Music Transformer has none).

    Example:

    >>> relative_attention_weights(num_heads=8, head_dim=64, max_distance=16)["relative_key_embeddings"][0]
    (33, 64)
    """
    shape = (2 * max_distance + 1, head_dim)
    if per_head:
        shape = (num_heads,) + shape
    names = ["relative_key_embeddings"] + (["relative_value_embeddings"] if value_embeddings else [])
    return {name: (shape, keras.initializers.RandomNormal(stddev=head_dim**-0.5)) for name in names}


@register_mechanism(
    "relative", weights=relative_attention_weights, value_arguments=("relative_value_embeddings",)
)
def relative_attention(
    query,
    key,
    value,
    attention_mask=None,
    is_causal=False,
    dropout_rate=0.0,
    training=False,
    seed_generator=None,
    relative_key_embeddings=None,
    relative_value_embeddings=None,
    max_distance=None,
    query_offset=None,
    scale=None,
):
    """Shaw et al. relative position attention over `(batch, length, num_heads, head_dim)` tensors.

    Args:
        query: tensor of shape `(B, T, N, H)`. The queries.
        key: tensor of shape `(B, S, N, H)`. The keys.
        value: tensor of shape `(B, S, N, M)`. The values; `M` may differ
            from `H` (then w^V is `M` wide).
        attention_mask: bool tensor or None. Broadcastable to `(B, N, T, S)`;
            `True` attends.
        is_causal: bool. Also forbid attending to later positions. With
            `T == S` (and the default `query_offset`) the relative logits
            come from the Music Transformer skew.
        dropout_rate: float. Dropout on the attention probabilities while
            training.
        training: bool. Whether dropout is active.
        seed_generator: `keras.random.SeedGenerator` or None. The dropout's
            seed generator.
        relative_key_embeddings: tensor of shape `(2k + 1, H)` or
            `(N, 2k + 1, H)`. w^K, shared by all heads or per head; row `r`
            is distance `r − k`.
        relative_value_embeddings: tensor or None. w^V, the same layout with
            `M` columns, or `None` for no a^V term.
        max_distance: int or None. The clipping distance k; `None`: inferred
            from the tables' rows (checked against them when given).
        query_offset: int, int32 scalar tensor or None. Absolute position of
            the first query (keys start at 0); `None`: `S − T`.
        scale: float or None. The logit scale; `None`: `1 / sqrt(H)`.

    Returns:
        `(B, T, N, M)`.

    Example:

    >>> import numpy as np
    >>> q = np.random.rand(2, 5, 4, 8).astype("float32")
    >>> table = np.random.rand(2 * 3 + 1, 8).astype("float32")  # k = 3, shared by the heads
    >>> tuple(relative_attention(q, q, q, relative_key_embeddings=table, is_causal=True).shape)
    (2, 5, 4, 8)
    """
    if relative_key_embeddings is None:
        raise ValueError(
            "relative attention needs relative_key_embeddings, (2k + 1, head_dim) or "
            "(num_heads, 2k + 1, head_dim); see relative_attention_weights()."
        )
    query = ops.convert_to_tensor(query)
    key = ops.convert_to_tensor(key, dtype=query.dtype)
    value = ops.convert_to_tensor(value, dtype=query.dtype)
    num_heads, head_dim = query.shape[2], query.shape[3]
    key_table = ops.convert_to_tensor(relative_key_embeddings, dtype=query.dtype)
    _check_table(key_table, "relative_key_embeddings", num_heads, head_dim)
    max_distance = _max_distance_of(key_table, max_distance, "relative_key_embeddings")
    value_table = None
    if relative_value_embeddings is not None:
        value_table = ops.convert_to_tensor(relative_value_embeddings, dtype=query.dtype)
        _check_table(value_table, "relative_value_embeddings", num_heads, value.shape[3], "value")
        _max_distance_of(value_table, max_distance, "relative_value_embeddings")

    query_length, key_length = axis_size(query), axis_size(key)
    static = isinstance(query_length, int) and isinstance(key_length, int)
    default_offset = query_offset is None or (
        static and isinstance(query_offset, int) and query_offset == key_length - query_length
    )
    if query_offset is None:
        query_offset = key_length - query_length
    window = _distance_window(query_length, key_length, query_offset, max_distance, is_causal)

    if scale is None:
        scale = 1.0 / math.sqrt(head_dim)
    logits = ops.einsum("btnh,bsnh->bnts", query, key)
    if is_causal and static and query_length == key_length and default_offset:
        # E_r[r] = w^K_{clip(r − (L − 1), −k, k)}: the table row of each causal distance.
        rows = relative_position_indices(1, key_length, max_distance, query_offset=key_length - 1)[0]
        logits = logits + skewed_relative_logits(query, ops.take(key_table, rows, axis=-2))
    else:
        logits = logits + _gathered_relative_logits(
            query, key_table, key_length, window, max_distance, query_offset
        )
    logits = logits * ops.cast(scale, logits.dtype)

    mask = None if attention_mask is None else ops.cast(attention_mask, "bool")
    if is_causal:
        causal = causal_mask(query_length, key_length, offset=query_offset)
        mask = causal if mask is None else ops.logical_and(mask, causal)
    if mask is not None:
        logits = ops.where(mask, logits, masked_logit(logits.dtype))
    probabilities = softmax_last_axis(logits)
    if training and dropout_rate > 0.0:
        probabilities = random.dropout(probabilities, dropout_rate, seed=seed_generator)

    output = ops.einsum("bnts,bsnh->btnh", probabilities, value)
    if value_table is not None:
        buckets = _bucketed(probabilities, window, query_offset)
        output = output + _value_term(buckets, value_table, window, max_distance)
    return output


def _attend_over_cache(query, key_cache, value_cache, attention_mask, query_offset, is_causal, **arguments):
    """Queries at absolute positions `query_offset …` over a key/value cache:
    the relative distances count from there (`KeyValueCache`'s `attend`)."""
    del is_causal  # in the mask
    return relative_attention(
        query, key_cache, value_cache, attention_mask=attention_mask, query_offset=query_offset, **arguments
    )


register_decoding("relative", KeyValueCache(_attend_over_cache))
