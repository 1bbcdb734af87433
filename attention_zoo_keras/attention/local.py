"""Block-local attention — Parmar, Vaswani, Uszkoreit, Kaiser, Shazeer, Ku
and Tran, 2018, "Image Transformer" (ICML 2018), §3.2; and the Reformer's
local attention (Kitaev, Kaiser and Levskaya, 2020).

Softmax attention in which a query attends only to a memory around its
query block of `b = block_size` positions: the block itself and
`m = num_memory_blocks` blocks on each side (the left flank only under
`is_causal`),

    O_i = Σ_{j ∈ M(i)} softmax_j(q_i·k_j / √d + mask_ij) v_j,
    M(i) = { j : k − m ≤ ⌊j/b⌋ ≤ k + m },   k = ⌊i/b⌋

The Reformer's variant adds `num_memory_blocks_after` and `cyclic=True`.
Computed blockwise with `softmax_attention` (the fused kernel at inference),
never as an L×L matrix: time O(B·N·L·M·d) with M = (m + 1 + a)·b.

`docs/attention/local.md` holds the whole description: the Reformer's
variant, the computation, masks and decoding.
"""

import numpy as np
from keras import ops

from attention_zoo_keras.attention.blocks import attend_blocks
from attention_zoo_keras.attention.blocks import axis_size
from attention_zoo_keras.attention.blocks import blocks_with_neighbours
from attention_zoo_keras.attention.blocks import check_self_attention
from attention_zoo_keras.attention.blocks import count_blocks
from attention_zoo_keras.attention.blocks import cyclic_neighbours
from attention_zoo_keras.attention.blocks import pad_length
from attention_zoo_keras.attention.decoding import KeyValueCache
from attention_zoo_keras.attention.masks import gather_mask
from attention_zoo_keras.attention.masks import mask_4d
from attention_zoo_keras.attention.registry import register_decoding
from attention_zoo_keras.attention.registry import register_mechanism
from attention_zoo_keras.attention.softmax import softmax_attention

DEFAULT_BLOCK_SIZE = 128
DEFAULT_NUM_MEMORY_BLOCKS = 1


def _check_block_arguments(block_size, num_memory_blocks, num_memory_blocks_after=None):
    if not isinstance(block_size, (int, np.integer)) or block_size < 1:
        raise ValueError(f"block_size must be a positive integer; got {block_size!r}.")
    if not isinstance(num_memory_blocks, (int, np.integer)) or num_memory_blocks < 0:
        raise ValueError(f"num_memory_blocks must be a non-negative integer; got {num_memory_blocks!r}.")
    if num_memory_blocks_after is not None and (
        not isinstance(num_memory_blocks_after, (int, np.integer)) or num_memory_blocks_after < 0
    ):
        raise ValueError(
            f"num_memory_blocks_after must be None or a non-negative integer; got {num_memory_blocks_after!r}."
        )


def _flanks(num_memory_blocks, num_memory_blocks_after, is_causal, cyclic):
    """`(left, right)`: the blocks before and after the query block in its memory."""
    left = int(num_memory_blocks)
    if num_memory_blocks_after is None:
        right = 0 if is_causal else left
    else:
        right = int(num_memory_blocks_after)
    if is_causal and not cyclic:
        right = 0  # later blocks are wholly in the future
    return left, right


def local_mask(
    length,
    block_size=DEFAULT_BLOCK_SIZE,
    num_memory_blocks=DEFAULT_NUM_MEMORY_BLOCKS,
    is_causal=False,
    query_offset=0,
    query_length=None,
    num_memory_blocks_after=None,
    cyclic=False,
):
    """The dense boolean pattern of `local_attention`: query `i` may attend
    to key `j` iff `⌊i/b⌋ − m ≤ ⌊j/b⌋ ≤ ⌊i/b⌋ + a` (`a` =
    `num_memory_blocks_after`, by default `m`, or `0` and `j ≤ i` with
    `is_causal`).

    Args:
        length: int or int32 scalar tensor. The number of keys `L`
            (positions `0 … L − 1`).
        block_size: int. As in `local_attention`.
        num_memory_blocks: int. As in `local_attention`.
        is_causal: bool. As in `local_attention`.
        query_offset: int or int32 scalar tensor. Absolute position of the
            first query row.
        query_length: int or None. The number of query rows; `None`:
            `length`.
        num_memory_blocks_after: int or None. As in `local_attention`.
        cyclic: bool. As in `local_attention`; with `cyclic` the blocks are the
            `⌈L/b⌉` blocks of `L` positions, counted modulo their number
            (`length` and `block_size` must then be Python ints). Where a
            window holds one block more than once (fewer blocks than the
            window has) `local_attention` counts its keys as often; this
            pattern shows them once.

    Returns:
        `(query_length, length)` boolean. O(L²) memory for all rows: for
        tests, visualisation and decoding against a key/value cache (the
        rows of the new positions), not for the forward pass.
    """
    _check_block_arguments(block_size, num_memory_blocks, num_memory_blocks_after)
    left, right = _flanks(num_memory_blocks, num_memory_blocks_after, is_causal, cyclic)
    query_length = length if query_length is None else query_length
    key_positions = ops.arange(length, dtype="int32")
    query_positions = ops.arange(query_length, dtype="int32") + ops.cast(query_offset, "int32")
    query_block = (query_positions // block_size)[:, None]
    key_block = (key_positions // block_size)[None, :]
    if cyclic:
        num_blocks = count_blocks(length, block_size)
        mask = ops.zeros((query_length, length), "bool")
        for offset in range(-left, right + 1):  # a shift by more than the blocks is no shift
            shift = offset if abs(offset) <= num_blocks else 0
            mask = ops.logical_or(mask, key_block == (query_block + shift) % num_blocks)
    else:
        mask = ops.logical_and(key_block >= query_block - left, key_block <= query_block + right)
    if is_causal:
        mask = ops.logical_and(mask, key_positions[None, :] <= query_positions[:, None])
    return mask


def _attend_over_cache(
    query,
    key_cache,
    value_cache,
    attention_mask,
    query_offset,
    is_causal,
    block_size=DEFAULT_BLOCK_SIZE,
    num_memory_blocks=DEFAULT_NUM_MEMORY_BLOCKS,
    num_memory_blocks_after=None,
    cyclic=False,
    **arguments,
):
    """Queries at absolute positions `query_offset …` over a key/value cache,
    restricted to their rows of `local_mask` (`KeyValueCache`'s `attend`).
    Dense over the cache: one new token costs a row of L, as for softmax.
    Never cyclic: the cache's length is not the sequence's, and under
    causality the wrapped-around blocks only matter with look-after blocks,
    which transformers' Reformer decoding does not wrap either."""
    del cyclic
    window = local_mask(
        axis_size(key_cache), block_size, num_memory_blocks, is_causal,
        query_offset=query_offset, query_length=axis_size(query),
        num_memory_blocks_after=num_memory_blocks_after,
    )[None, None, :, :]
    mask = window if attention_mask is None else ops.logical_and(attention_mask, window)
    return softmax_attention(query, key_cache, value_cache, attention_mask=mask, **arguments)


@register_mechanism("local")
def local_attention(
    query,
    key,
    value,
    attention_mask=None,
    is_causal=False,
    dropout_rate=0.0,
    training=False,
    seed_generator=None,
    block_size=DEFAULT_BLOCK_SIZE,
    num_memory_blocks=DEFAULT_NUM_MEMORY_BLOCKS,
    scale=None,
    num_memory_blocks_after=None,
    cyclic=False,
):
    """Local 1D attention over `(batch, length, num_heads, head_dim)` tensors.

    Block `k = ⌊i/b⌋` of `block_size` positions attends to blocks
    `k − m … k + a` (`m = num_memory_blocks`, `a = num_memory_blocks_after`,
    by default `m`), or `k − m … k` and `j ≤ i` with `is_causal`; see the
    module docstring. Equal to softmax attention under
    `local_mask(L, block_size, num_memory_blocks, is_causal,
    num_memory_blocks_after=a, cyclic=cyclic)` (but for the repeated blocks
    of a cyclic window longer than the sequence's blocks).

    Args:
        query: tensor of shape `(B, L, N, D)`. The queries.
        key: tensor of shape `(B, L, N, D)`. The keys (self-attention: the
            same length as `query`).
        value: tensor of shape `(B, L, N, M)`. The values.
        attention_mask: bool tensor or None. Broadcastable to `(B, N, L, L)`;
            intersected with the local window (key-padding masks are
            cheapest).
        is_causal: bool. The left flank only, and `j ≤ i`.
        dropout_rate: float. Dropout on the attention probabilities while
            training (as in `softmax_attention`).
        training: bool. Whether dropout is active.
        seed_generator: `keras.random.SeedGenerator` or None. The dropout's
            seed generator.
        block_size: int. Query block length `b` (at most `L` is used, which
            changes nothing but the padding).
        num_memory_blocks: int. Neighbouring blocks `m` on each side (left
            only when causal); 0 attends within the block only.
        scale: float or None. The logit scale; `None`: `1 / sqrt(D)`.
        num_memory_blocks_after: int or None. Blocks `a` after the query
            block; `None`: `m` (non-causal only: under `is_causal` later
            blocks are in the future, unless `cyclic` wraps them round). The
            Reformer's `local_num_chunks_after`, with `num_memory_blocks` its
            `local_num_chunks_before`.
        cyclic: bool. Count neighbouring blocks cyclically, as the Reformer
            does
            (trax, transformers' `LocalSelfAttention`): the first block's
            left neighbours are the last blocks, instead of nothing. With
            padding to a whole number of blocks the wrapped-in padding is
            masked, the wrapped-in real positions are not. A sequence of
            one block attends to itself (the Reformer's "standard
            attention" for `L ≤ chunk_length`).

    Returns:
        `(B, L, N, M)`.

    Example:

    >>> import numpy as np
    >>> q = np.random.rand(2, 10, 4, 8).astype("float32")
    >>> tuple(local_attention(q, q, q, is_causal=True, block_size=4).shape)
    (2, 10, 4, 8)
    """
    _check_block_arguments(block_size, num_memory_blocks, num_memory_blocks_after)
    check_self_attention(query, key, value, "Local")
    length = axis_size(query)
    block = max(1, min(int(block_size), length)) if isinstance(length, int) else int(block_size)
    num_blocks = count_blocks(length, block)
    padding = num_blocks * block - length
    left, right = _flanks(num_memory_blocks, num_memory_blocks_after, is_causal, cyclic)
    if cyclic and isinstance(num_blocks, int) and num_blocks == 1:
        left = right = 0  # the neighbours would all be this block again
    memory = (left + right + 1) * block
    batch = ops.shape(query)[0]

    query_blocks = pad_length(query, padding)
    query_blocks = ops.reshape(query_blocks, (batch, -1, block) + tuple(query.shape[2:]))
    if cyclic:
        key_memory, value_memory = (
            cyclic_neighbours(
                ops.reshape(pad_length(x, padding), (batch, -1, block) + tuple(x.shape[2:])), left, right
            )
            for x in (key, value)
        )
    else:
        key_memory = blocks_with_neighbours(pad_length(key, padding), num_blocks, block, left, right)
        value_memory = blocks_with_neighbours(pad_length(value, padding), num_blocks, block, left, right)

    # Positions and the window: numpy constants for a static length (built
    # once when traced), keras.ops for a dynamic one.
    xp = np if isinstance(length, int) else ops
    block_index = xp.arange(num_blocks)[:, None, None]
    query_position = block_index * block + xp.arange(block)[None, :, None]  # (blocks, b, 1)
    if cyclic:
        positions = xp.reshape(xp.arange(num_blocks * block), (1, num_blocks, block))
        key_position = cyclic_neighbours(positions, left, right, xp.concatenate)[0][:, None, :]  # (blocks, 1, M)
    else:
        key_position = (block_index - left) * block + xp.arange(memory)[None, None, :]  # (blocks, 1, M)
    visible = xp.logical_and(key_position >= 0, key_position < length)
    if is_causal:
        visible = xp.logical_and(visible, key_position <= query_position)
    # Padded queries attend to everything in their window: never a fully masked row.
    query_padding = query_position >= length
    if attention_mask is not None:
        user = mask_4d(attention_mask, length, length)
        last = length - 1
        user = gather_mask(user, ops.minimum(query_position, last), ops.clip(key_position, 0, last))
        visible = ops.logical_or(ops.logical_and(user, visible), query_padding)
    else:
        visible = xp.logical_or(visible, query_padding)[None, None]
    output = attend_blocks(
        query_blocks, key_memory, value_memory, visible, batch, dropout_rate, training, seed_generator, scale
    )
    return output[:, :length]


register_decoding("local", KeyValueCache(_attend_over_cache))
