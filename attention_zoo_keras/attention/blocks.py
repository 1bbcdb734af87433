"""Helpers shared by the mechanisms that attend block by block (local 1D
and 2D, sparse, LSH's chunks) and by others that need a tensor's length.

A blockwise mechanism cuts the sequence into blocks of `b` positions
(padding the end to a whole number of blocks), assembles each block's
memory from neighbouring blocks, and runs softmax attention per block under
the window's boolean mask — never an L×L matrix.
"""

import numpy as np
from keras import ops

from attention_zoo_keras.attention.softmax import softmax_attention


def axis_size(x, axis=1):
    """The static size of `x` along `axis`, or its dynamic size."""
    size = x.shape[axis]
    return ops.shape(x)[axis] if size is None else size


def check_positive_int(value, name, minimum=1):
    """`value` as an int; raises `ValueError` naming `name` unless it is an
    integer (not a bool) ≥ `minimum` (1: positive, 0: non-negative)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        kind = "positive" if minimum == 1 else "non-negative"
        raise ValueError(f"{name} must be a {kind} integer; got {value!r}.")
    return int(value)


def check_self_attention(query, key, value, name):
    """Raises `ValueError` unless key and value have one length and the
    query the same (a blockwise mechanism's blocks of queries and keys are
    the same positions); `name` is the mechanism's, for the message."""
    query_length, key_length, value_length = query.shape[1], key.shape[1], value.shape[1]
    if key_length is not None and value_length is not None and key_length != value_length:
        raise ValueError(f"key and value must have the same length; got {key_length} and {value_length}.")
    if query_length is not None and key_length is not None and query_length != key_length:
        raise ValueError(
            f"{name} attention is self-attention over one sequence: query and key lengths must be "
            f"equal; got {query_length} and {key_length}. For incremental decoding against a "
            "key/value cache, use the mechanism's decoding cache (attention.get_decoding)."
        )


def pad_length(x, padding):
    """`x` padded with `padding` zero positions at the end of axis 1."""
    if isinstance(padding, int) and padding == 0:
        return x
    return ops.pad(x, [[0, 0], [0, padding]] + [[0, 0]] * (len(x.shape) - 2))


def count_blocks(length, block):
    """`⌈length / block⌉`, for a Python int or a traced length."""
    if isinstance(length, int):
        return -(-length // block)
    return (length + block - 1) // block


def blocks_with_neighbours(x, count, block, left, right):
    """`(B, count·block, …)` → `(B, count, (left + 1 + right)·block, …)`:
    for block `k`, blocks `k − left … k + right` concatenated in order, zero
    blocks standing in beyond either end."""
    widths = [[0, 0], [left * block, right * block]] + [[0, 0]] * (len(x.shape) - 2)
    if left or right:
        x = ops.pad(x, widths)
    tail = tuple(ops.shape(x)[a] if x.shape[a] is None else x.shape[a] for a in range(2, len(x.shape)))
    x = ops.reshape(x, (ops.shape(x)[0], -1, block) + tail)
    if left + right == 0:
        return x
    return ops.concatenate([x[:, offset : offset + count] for offset in range(left + right + 1)], axis=2)


def cyclic_neighbours(blocks, left, right, concatenate=ops.concatenate, axis=1):
    """`(…, num_blocks, block, …)` → `(…, num_blocks, (left + 1 + right)·block, …)`
    with the blocks on `axis` (by default `(B, num_blocks, block, …)`): for
    block `k`, blocks `k − left … k + right` counted cyclically (the first
    block's left neighbour is the last block), exactly as trax's and
    transformers' `look_adjacent`: the shift by `o` is the slice pair
    `[o:], [:o]`, so a shift by more than the number of blocks is no shift.
    `concatenate` is `np.concatenate` for numpy positions."""
    if left + right == 0:
        return blocks
    lead = (slice(None),) * axis
    shifted = []
    for offset in range(-left, right + 1):
        if offset == 0:
            shifted.append(blocks)
        else:
            parts = [blocks[lead + (slice(offset, None),)], blocks[lead + (slice(None, offset),)]]
            shifted.append(concatenate(parts, axis=axis))
    return concatenate(shifted, axis=axis + 1)


def attend_blocks(query_blocks, key_memory, value_memory, mask, batch, dropout_rate, training, seed_generator, scale):
    """Softmax attention of `(B, blocks, q, N, d)` queries over their
    `(B, blocks, M, N, d)` memories (values `(B, blocks, M, N, d_v)`) under
    a boolean `mask` broadcastable to `(B, N, blocks, q, M)` (given as
    `(B or 1, N or 1, blocks, q, M)`); returns `(B, blocks·q, N, d_v)`.

    The blocks are folded into the batch and attended by
    `softmax_attention`: the backend's fused kernel at inference, and the
    same attention dropout as softmax attention while training."""
    count, q_len = query_blocks.shape[1], query_blocks.shape[2]
    count = ops.shape(query_blocks)[1] if count is None else count
    heads, depth = query_blocks.shape[3], query_blocks.shape[4]
    memory, value_depth = key_memory.shape[2], value_memory.shape[4]
    folded_query = ops.reshape(query_blocks, (-1, q_len, heads, depth))
    folded_key = ops.reshape(key_memory, (-1, memory, heads, depth))
    folded_value = ops.reshape(value_memory, (-1, memory, heads, value_depth))
    mask_heads = mask.shape[1]
    mask = ops.transpose(mask, (0, 2, 1, 3, 4))  # (B or 1, blocks, N or 1, q, M)
    mask = ops.broadcast_to(mask, (batch, count, mask_heads, q_len, memory))
    mask = ops.reshape(mask, (-1, mask_heads, q_len, memory))
    output = softmax_attention(
        folded_query,
        folded_key,
        folded_value,
        attention_mask=mask,
        dropout_rate=dropout_rate,
        training=training,
        seed_generator=seed_generator,
        scale=scale,
    )
    return ops.reshape(output, (batch, -1, heads, value_depth))
