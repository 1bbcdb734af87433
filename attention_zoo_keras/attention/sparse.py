"""Sparse factorised attention — Child, Gray, Radford and Sutskever, 2019,
"Generating Long Sequences with Sparse Transformers", §4.2–4.3.

Softmax attention in which query `i` attends only to a set `S_i` of keys,

    O_i = Σ_{j ∈ S_i} softmax_j(q_i·k_j / √d) v_j,

built from two factors with stride `l`, each intersected with `j ≤ i`:
`pattern="strided"`, the previous l positions and every l-th position back;
`pattern="fixed"`, the query's own block and the last `c` "summary" cells of
every block. `combine` merges the factors in every head or spreads them over
heads. Computed blockwise, never as a masked L×L matrix: O(L·(2l + L/l))
time·d and memory for strided, O(L·√L) at l ≈ √L.

`docs/attention/sparse.md` holds the whole description: the exact sets,
`combine`, the non-causal extension, the blockwise computation, masks, empty
sets, dropout and decoding.
"""

import math

import numpy as np
from keras import ops
from keras import random

from attention_zoo_keras.attention.blocks import axis_size
from attention_zoo_keras.attention.blocks import blocks_with_neighbours
from attention_zoo_keras.attention.blocks import check_self_attention
from attention_zoo_keras.attention.blocks import count_blocks
from attention_zoo_keras.attention.blocks import pad_length
from attention_zoo_keras.attention.decoding import KeyValueCache
from attention_zoo_keras.attention.masks import gather_mask
from attention_zoo_keras.attention.masks import mask_4d
from attention_zoo_keras.attention.masks import masked_logit
from attention_zoo_keras.attention.masks import softmax_last_axis
from attention_zoo_keras.attention.registry import register_decoding
from attention_zoo_keras.attention.registry import register_mechanism
from attention_zoo_keras.attention.softmax import softmax_attention
from attention_zoo_keras.naming import did_you_mean

PATTERNS = ("strided", "fixed")
COMBINES = ("merged", "heads", "a", "b")
DEFAULT_STRIDE = 128
DEFAULT_SUMMARY = 8


def _check_arguments(pattern, stride, c, combine):
    if pattern not in PATTERNS:
        raise ValueError(
            f"Unknown sparse attention pattern '{pattern}'.{did_you_mean(pattern, PATTERNS)} "
            f"Known patterns: {', '.join(PATTERNS)}."
        )
    if combine not in COMBINES:
        raise ValueError(
            f"Unknown way to combine sparse attention patterns '{combine}'.{did_you_mean(combine, COMBINES)} "
            f"Known: {', '.join(COMBINES)} (merged: the union in every head; heads: A in even heads, "
            "B in odd heads; a / b: one factor only)."
        )
    if not isinstance(stride, (int, np.integer)) or stride < 1:
        raise ValueError(f"stride must be a positive integer; got {stride!r}.")
    if pattern == "fixed" and (not isinstance(c, (int, np.integer)) or not 1 <= c <= stride):
        raise ValueError(f"The fixed pattern needs 1 ≤ c ≤ stride ({stride}); got c={c!r}.")


def _factors(pattern, query_position, key_position, stride, c, is_causal, xp=ops):
    """Boolean `(A⁽¹⁾, A⁽²⁾)` membership of `key_position` for `query_position`
    (integer arrays broadcast against each other; `xp` is `keras.ops`, or
    `numpy` for static positions)."""
    if pattern == "strided":
        distance = query_position - key_position
        first = xp.abs(distance) <= stride
        second = xp.mod(distance, stride) == 0
    else:
        first = xp.floor_divide(query_position, stride) == xp.floor_divide(key_position, stride)
        second = xp.mod(key_position, stride) >= stride - c
    if is_causal:
        earlier = key_position <= query_position
        first, second = xp.logical_and(first, earlier), xp.logical_and(second, earlier)
    return first, second


def _combined(first, second, combine, num_heads, xp=ops):
    """The pattern per `combine`; with `"heads"`, a leading head axis."""
    if combine == "merged":
        return xp.logical_or(first, second)
    if combine == "a":
        return first
    if combine == "b":
        return second
    head_uses_first = xp.mod(xp.arange(num_heads), 2) == 0
    head_uses_first = xp.reshape(head_uses_first, (num_heads,) + (1,) * len(first.shape))
    return xp.where(head_uses_first, first[None], second[None])


def sparse_mask(
    length,
    pattern="strided",
    stride=DEFAULT_STRIDE,
    c=DEFAULT_SUMMARY,
    combine="merged",
    is_causal=True,
    num_heads=2,
    query_offset=0,
    query_length=None,
):
    """The dense boolean attention pattern of `sparse_attention`.

    Args:
        length: int or int32 scalar tensor. The sequence length `L` (key
            positions `0 … L − 1`).
        pattern: str. `"strided"` or `"fixed"` (see
            `docs/attention/sparse.md`).
        stride: int. `l`.
        c: int. Summary cells per block (`"fixed"` only).
        combine: str. `"merged"` (A⁽¹⁾ ∪ A⁽²⁾), `"a"`, `"b"` → `(L, L)`;
            `"heads"` → `(num_heads, L, L)`, head `h` using A⁽¹⁾ if `h` is
            even, A⁽²⁾ if odd.
        is_causal: bool. Intersect with `j ≤ i` (the paper's setting).
        num_heads: int. The number of heads for `combine="heads"`.
        query_offset: int or int32 scalar tensor. Absolute position of the
            first query row.
        query_length: int or None. The number of query rows; `None`:
            `length`.

    Returns:
        A boolean tensor, `True` where query `i` (row) may attend to key `j`;
        `(query_length, L)`, or `(num_heads, query_length, L)` with `"heads"`.
        O(L²) memory: for tests, visualisation and decoding against a
        key/value cache, not for the forward pass.

    Example:

    >>> import numpy as np
    >>> np.asarray(sparse_mask(5, "strided", stride=2)).astype(int)
    array([[1, 0, 0, 0, 0],
           [1, 1, 0, 0, 0],
           [1, 1, 1, 0, 0],
           [0, 1, 1, 1, 0],
           [1, 0, 1, 1, 1]])
    """
    _check_arguments(pattern, stride, c, combine)
    query_length = length if query_length is None else query_length
    key_positions = ops.arange(length, dtype="int32")
    query_positions = ops.arange(query_length, dtype="int32") + ops.cast(query_offset, "int32")
    first, second = _factors(pattern, query_positions[:, None], key_positions[None, :], stride, c, is_causal)
    first, second = (ops.broadcast_to(factor, (query_length, length)) for factor in (first, second))
    return _combined(first, second, combine, num_heads)


@register_mechanism("sparse")
def sparse_attention(
    query,
    key,
    value,
    attention_mask=None,
    is_causal=False,
    dropout_rate=0.0,
    training=False,
    seed_generator=None,
    pattern="strided",
    stride=DEFAULT_STRIDE,
    c=DEFAULT_SUMMARY,
    combine="merged",
    scale=None,
):
    """Sparse Transformer attention over `(batch, length, num_heads, head_dim)` tensors.

    Equal to softmax attention under `sparse_mask(L, pattern, stride, c,
    combine, is_causal, num_heads)` (intersected with `attention_mask`),
    computed blockwise; see `docs/attention/sparse.md`. Pass `is_causal=True` for
    the paper's autoregressive patterns.

    Args:
        query: tensor of shape `(B, L, N, D)`. The queries.
        key: tensor of shape `(B, L, N, D)`. The keys (self-attention: the
            same length as `query`).
        value: tensor of shape `(B, L, N, M)`. The values.
        attention_mask: bool tensor or None. Broadcastable to `(B, N, L, L)`;
            intersected with the pattern.
        is_causal: bool. Intersect the pattern with `j ≤ i` (the paper's
            setting); without it, the non-causal extension in
            `docs/attention/sparse.md`.
        dropout_rate: float. Dropout on the attention probabilities while
            training.
        training: bool. Whether dropout is active.
        seed_generator: `keras.random.SeedGenerator` or None. The dropout's
            seed generator.
        pattern: str. `"strided"` or `"fixed"`.
        stride: int. `l`, the block length and stride (the paper: about √L).
        c: int. Summary cells at the end of each block (`"fixed"` only).
        combine: str. `"merged"`, `"heads"`, `"a"` or `"b"`.
        scale: float or None. The logit scale; `None`: `1 / sqrt(D)`.

    Returns:
        `(B, L, N, M)`.

    Example:

    >>> import numpy as np
    >>> q = np.random.rand(2, 10, 4, 8).astype("float32")
    >>> tuple(sparse_attention(q, q, q, is_causal=True, pattern="fixed", stride=4, c=1).shape)
    (2, 10, 4, 8)
    """
    _check_arguments(pattern, stride, c, combine)
    check_self_attention(query, key, value, "Sparse")
    length = axis_size(query)
    num_blocks = count_blocks(length, stride)
    padding = num_blocks * stride - length
    batch = ops.shape(query)[0]
    num_heads, depth, value_depth = query.shape[2], query.shape[3], value.shape[3]
    if scale is None:
        scale = 1.0 / math.sqrt(depth)

    query_blocks = ops.reshape(pad_length(query, padding), (batch, -1, stride, num_heads, depth))
    key, value = pad_length(key, padding), pad_length(value, padding)
    # Positions and pattern masks: numpy constants for a static length (built
    # once when traced), keras.ops for a dynamic one.
    xp = np if isinstance(length, int) else ops
    block_index = xp.arange(num_blocks)[:, None, None]
    query_position = block_index * stride + xp.arange(stride)[None, :, None]  # (blocks, l, 1)
    last = length - 1
    user = None if attention_mask is None else mask_4d(attention_mask, length, length)

    def visible(key_position, near_blocks=None):
        """The pattern ∧ key inside the sequence ∧ the user's mask; with
        `near_blocks = (first, last)` block offsets, keys of the near part
        are excluded (they are counted there)."""
        first, second = _factors(pattern, query_position, key_position, stride, c, is_causal, xp)
        mask = _combined(first, second, combine, num_heads, xp)
        mask = xp.logical_and(mask, xp.logical_and(key_position >= 0, key_position < length))
        if near_blocks is not None:
            key_block = xp.floor_divide(key_position, stride)
            near = xp.logical_and(key_block >= block_index + near_blocks[0], key_block <= block_index + near_blocks[1])
            mask = xp.logical_and(mask, xp.logical_not(near))
        if user is not None:
            gathered = gather_mask(user, ops.minimum(query_position, last), ops.clip(key_position, 0, last))
            mask = ops.logical_and(gathered, mask)
        return mask

    masked = masked_logit(query_blocks.dtype)

    # Near part: the query's block and its neighbours.
    left, right = (1, 0 if is_causal else 1) if pattern == "strided" else (0, 0)
    near_key = blocks_with_neighbours(key, num_blocks, stride, left, right)  # (B, blocks, W, N, D)
    near_value = blocks_with_neighbours(value, num_blocks, stride, left, right)
    near_width = (left + right + 1) * stride
    near_position = (block_index - left) * stride + xp.arange(near_width)[None, None, :]  # (blocks, 1, W)
    near_logits = ops.einsum("bkinh,bkjnh->bnkij", query_blocks, near_key)
    scale = ops.cast(scale, near_logits.dtype)
    near_mask = visible(near_position)
    logits = [ops.where(near_mask, near_logits * scale, masked)]
    mask_ops = xp if user is None else ops  # the user's mask is a tensor
    any_visible = mask_ops.any(near_mask, axis=-1, keepdims=True)

    # Far part: the query's column (strided) or the summary cells (fixed).
    use_far = combine != "a"  # A⁽¹⁾ lies inside the near part
    if use_far:
        key_blocks = ops.reshape(key, (batch, -1, stride, num_heads, depth))
        value_blocks = ops.reshape(value, (batch, -1, stride, num_heads, value_depth))
        if pattern == "strided":
            far_position = xp.arange(num_blocks)[None, None, :] * stride + xp.arange(stride)[None, :, None]
            far_logits = ops.einsum("bkrnh,bprnh->bnkrp", query_blocks, key_blocks)  # (B, N, blocks, l, blocks)
            far_value = value_blocks
        else:
            far_key = ops.reshape(key_blocks[:, :, stride - c :], (batch, -1, num_heads, depth))
            far_value = ops.reshape(value_blocks[:, :, stride - c :], (batch, -1, num_heads, value_depth))
            cell = xp.arange(num_blocks * c)
            far_position = (xp.floor_divide(cell, c) * stride + stride - c + xp.mod(cell, c))[None, None, :]
            far_logits = ops.einsum("bkinh,bsnh->bnkis", query_blocks, far_key)  # (B, N, blocks, l, blocks·c)
        far_mask = visible(far_position, (-left, right))
        logits.append(ops.where(far_mask, far_logits * scale, masked))
        any_visible = mask_ops.logical_or(any_visible, mask_ops.any(far_mask, axis=-1, keepdims=True))

    logits = ops.concatenate(logits, axis=-1)
    probabilities = softmax_last_axis(logits)
    # A query with an empty set attends to nothing: output 0 (not a uniform
    # average over masked slots, which would include future keys).
    probabilities = ops.where(any_visible, probabilities, ops.zeros((), probabilities.dtype))
    if training and dropout_rate > 0.0:
        probabilities = random.dropout(probabilities, dropout_rate, seed=seed_generator)
    output = ops.einsum("bnkij,bkjnh->bkinh", probabilities[..., :near_width], near_value)
    if use_far:
        far_probabilities = probabilities[..., near_width:]
        if pattern == "strided":
            output = output + ops.einsum("bnkrp,bprnh->bkrnh", far_probabilities, far_value)
        else:
            output = output + ops.einsum("bnkis,bsnh->bkinh", far_probabilities, far_value)
    output = ops.reshape(output, (batch, -1, num_heads, value_depth))
    return output[:, :length]


def _attend_over_cache(
    query,
    key_cache,
    value_cache,
    attention_mask,
    query_offset,
    is_causal,
    pattern="strided",
    stride=DEFAULT_STRIDE,
    c=DEFAULT_SUMMARY,
    combine="merged",
    **arguments,
):
    """Queries at absolute positions `query_offset …` over a key/value cache,
    restricted to their rows of `sparse_mask` (`KeyValueCache`'s `attend`).

    A query whose row is empty (possible with `combine="heads"` or `"b"`)
    gets 0, as in `sparse_attention`.
    """
    num_heads = query.shape[2]
    rows = sparse_mask(
        axis_size(key_cache), pattern, stride, c, combine, is_causal, num_heads,
        query_offset=query_offset, query_length=axis_size(query),
    )
    rows = rows[None, None] if combine != "heads" else rows[None]
    mask = rows if attention_mask is None else ops.logical_and(attention_mask, rows)
    output = softmax_attention(query, key_cache, value_cache, attention_mask=mask, **arguments)
    attends_somewhere = ops.any(mask, axis=-1)  # (B or 1, N or 1, T)
    attends_somewhere = ops.transpose(attends_somewhere, (0, 2, 1))[..., None]  # (…, T, N, 1)
    return ops.where(attends_somewhere, output, ops.zeros((), output.dtype))


register_decoding("sparse", KeyValueCache(_attend_over_cache))
