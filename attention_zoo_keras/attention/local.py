"""Block-local attention — Parmar, Vaswani, Uszkoreit, Kaiser, Shazeer, Ku
and Tran, 2018, "Image Transformer" (ICML 2018), §3.2 "Local Self-Attention".

Softmax attention (Vaswani et al., 2017) in which a query attends only to
a *memory block* around the *query block* it belongs to:

    O_i = Σ_{j ∈ M(i)} softmax_j(q_i·k_j / √d + mask_ij) v_j

**Local 1D** (`local_attention`, registered as `"local"`). The sequence is
cut into query blocks of `b = block_size` positions, block `k` holding
positions `[k·b, (k+1)·b)`. Its memory is the block itself and
`m = num_memory_blocks` neighbouring blocks on each side:

    M(i) = { j : k − m ≤ ⌊j/b⌋ ≤ k + m },              k = ⌊i/b⌋
    M(i) = { j : k − m ≤ ⌊j/b⌋ ≤ k, j ≤ i }   (is_causal: left flank only)

Positions outside the sequence are absent (masked), not wrapped. With
`m = 1` and `is_causal` this is tensor2tensor's `masked_local_attention_1d`
(each block sees itself, causally, and the previous block; t2t also falls
back to a single block for sequences shorter than two blocks, which this
does not); the paper's "memory of l_m positions generated before the query
block" with `l_m = m·b`.

**The Reformer's local attention** (Kitaev, Kaiser and Levskaya, 2020,
"Reformer: The Efficient Transformer", ICLR 2020; trax's and transformers'
`LocalSelfAttention`) is this with `num_memory_blocks_after` (its
`local_num_chunks_after`; `num_memory_blocks` is `local_num_chunks_before`)
and `cyclic=True`: block `k` sees blocks `k − m … k + a` counted modulo the
number of blocks, so without causality the first block also sees the last
one(s) (`M(i) = { j : ⌊j/b⌋ ≡ k + o (mod ⌈L/b⌉), −m ≤ o ≤ a }`). Causal with
`a = 0` (its language models), wrapping changes nothing: the wrapped-in
blocks are in the future. Its large negative logit (−1e9) for masked keys
gives the same probabilities as an absent key for every query that sees at
least one key.

**Local 2D** (`local_attention_2d`, registered as `"local_2d"`). The
sequence holds an image of `image_shape = (H, W)` positions. Query blocks
are `block_shape = (b_h, b_w)` rectangles tiling the image from its top-left
corner; the block with top-left pixel `(r₀, c₀)` has the memory rectangle

    rows [r₀ − f_h, r₀ + b_h + f_h) × cols [c₀ − f_w, c₀ + b_w + f_w)
    rows [r₀ − f_h, r₀ + b_h)       × cols [c₀ − f_w, c₀ + b_w + f_w)   (is_causal)

with `memory_flange = (f_h, f_w)`: the paper's "memory blocks extending
the query block to the top, left and right by h_m, w_m and again w_m
pixels", i.e. (b_h + f_h) × (b_w + 2 f_w) under causality (tensor2tensor's
`masked_local_attention_2d`: a top region f_h × (b_w + 2 f_w), a left region
b_h × f_w and the query block itself) and (b_h + 2 f_h) × (b_w + 2 f_w)
without (tensor2tensor's `local_attention_2d`). Pixels outside the image are
absent (t2t pads with zeros and masks all-zero keys; here padding is masked
by position, so a real all-zero key is still attended to). Under `is_causal` a query additionally sees only memory positions at
or before itself *in the order of the sequence*, which `layout` names:

* `layout="raster"` (default): position `r·W + c` holds pixel `(r, c)`.
  Causal: rows above the query's, and its own row up to itself.
* `layout="block_raster"`: the Image Transformer's generation order —
  query blocks in raster order, pixels within a block in raster order
  (needs `H % b_h == 0` and `W % b_w == 0`). Causal then equals
  `masked_local_attention_2d` exactly: the top and left regions are
  earlier blocks (all visible), the right flank beside the block is a later
  block (hidden), and within the block the order is triangular.

The two layouts differ only in the flanks beside the query block: in raster
order the left flank below the query's row is in the future, and the right
flank above it in the past. Use the layout the model's sequence (and its
next-token targets) is actually in: a raster-order model with
`layout="block_raster"` would see the future.

**Computation.** Blockwise, never an L×L matrix: queries are reshaped into
`(batch·blocks, b, heads, d)`, each block's memory is assembled (1D:
shifted block slices, concatenated; 2D: a gather with precomputed
indices), and the blocks are attended by `softmax_attention` with the
window's boolean mask — so inference runs the backend's fused kernel and
attention dropout behaves exactly as in softmax attention (torch's fused
kernel with dropout; the einsum path with `keras.random.dropout` on JAX and
TensorFlow). Lengths that are not a multiple of the block size are padded
internally; padded keys are masked, padded queries are computed and
dropped (their rows are left unmasked so that no row of the padding is
fully masked and gradients stay finite).

Cost, with `M` the memory size (1D: `(m + 1 + a)·b`, `a = m` by default,
causal `(m + 1)·b`; 2D: `(b_h + 2f_h)(b_w + 2f_w)`, causal `(b_h + f_h)(b_w + 2f_w)`):
time O(B·N·L·M·d), memory O(B·N·L·M) for the logits and O(B·L·M·N·d)
for the assembled keys and values.

**Masks.** `attention_mask` (boolean, broadcastable to `(B, N, T, S)`,
`True` = may attend) is intersected with the local window:
`effective = window ∧ mask`. A key-padding mask (query axis of size 1) is
gathered per memory slot in O(L·M). A general (query, key) mask is gathered
the same way from its `(T, S)` entries inside the window; entries outside
the window have no effect (local attention never looks there) — it cannot
widen the window. A real query left with no visible key gets what
`softmax_attention` gives a fully masked row.

**Restrictions.** Self-attention only: query and key lengths must be equal
(the blocks of both are the same positions).

**Decoding.** 1D local attention decodes token by token with a key/value
cache (`get_decoding("local")`): the new queries attend over the cache
under their rows of `local_mask` — not blockwise, one row of the cache per
new token, like softmax; never cyclically (as transformers' Reformer
decoding, which attends to the last `local_num_chunks_before` chunks). (2D
local attention has no incremental decoding.)
"""

import numpy as np
from keras import ops

from attention_zoo_keras.attention.registry import register_decoding
from attention_zoo_keras.attention.registry import register_mechanism
from attention_zoo_keras.attention.softmax import KeyValueCache
from attention_zoo_keras.attention.softmax import softmax_attention

DEFAULT_BLOCK_SIZE = 128
DEFAULT_NUM_MEMORY_BLOCKS = 1
DEFAULT_BLOCK_SHAPE = (8, 16)  # tensor2tensor's query_shape default
DEFAULT_MEMORY_FLANGE = (8, 16)  # tensor2tensor's memory_flange default
LAYOUTS = ("raster", "block_raster")


# --- helpers shared with sparse.py ----------------------------------------


def _length(x, axis=1):
    """The static size of `x` along `axis`, or its dynamic size."""
    size = x.shape[axis]
    return ops.shape(x)[axis] if size is None else size


def _check_self_attention(query, key, value, name):
    query_length, key_length, value_length = query.shape[1], key.shape[1], value.shape[1]
    if key_length is not None and value_length is not None and key_length != value_length:
        raise ValueError(f"key and value must have the same length; got {key_length} and {value_length}.")
    if query_length is not None and key_length is not None and query_length != key_length:
        raise ValueError(
            f"{name} attention is self-attention over one sequence: query and key lengths must be "
            f"equal; got {query_length} and {key_length}. For incremental decoding against a "
            "key/value cache, use the mechanism's decoding cache (attention.registry.get_decoding)."
        )


def _mask_4d(attention_mask, query_length, key_length):
    """`attention_mask` as a boolean `(B or 1, N or 1, T or 1, S or 1)` tensor."""
    mask = ops.cast(ops.convert_to_tensor(attention_mask), "bool")
    rank = len(mask.shape)
    if rank == 0 or rank > 4:
        raise ValueError(
            "attention_mask must be broadcastable to (batch, num_heads, query_length, key_length); "
            f"got shape {tuple(mask.shape)}."
        )
    while len(mask.shape) < 4:
        mask = ops.expand_dims(mask, 0)
    for axis, length, name in ((2, query_length, "query"), (3, key_length, "key")):
        size = mask.shape[axis]
        if size not in (1, None) and isinstance(length, int) and size != length:
            raise ValueError(
                f"attention_mask's {name} axis has size {size}; expected 1 or the {name} length {length} "
                f"(mask shape {tuple(mask.shape)})."
            )
    return mask


def _gather_mask(mask, query_index, key_index):
    """The entries `mask[:, :, query_index, key_index]` of a 4D boolean mask.

    `query_index` and `key_index` are integer tensors (valid positions)
    broadcastable to each other, e.g. `(blocks, q, 1)` and `(blocks, 1, M)`.
    Axes of size 1 of `mask` stay broadcast: a key-padding mask costs one
    gather over the keys only. Returns `(B or 1, N or 1) + broadcast shape`.
    """
    full_query, full_key = mask.shape[2] != 1, mask.shape[3] != 1
    if not full_query and not full_key:
        return mask[:, :, :, :, None]
    if not full_query:
        return ops.take(mask[:, :, 0, :], key_index, axis=2)
    if not full_key:
        return ops.take(mask[:, :, :, 0], query_index, axis=2)
    key_length = mask.shape[3] if mask.shape[3] is not None else ops.shape(mask)[3]
    flat = ops.reshape(mask, (ops.shape(mask)[0], ops.shape(mask)[1], -1))
    return ops.take(flat, query_index * key_length + key_index, axis=2)


def _blocks_with_neighbours(x, num_blocks, block, left, right):
    """`(B, num_blocks·block, …)` → `(B, num_blocks, (left + 1 + right)·block, …)`:
    for block `k`, blocks `k − left … k + right` concatenated in order, zero
    blocks standing in beyond either end."""
    widths = [[0, 0], [left * block, right * block]] + [[0, 0]] * (len(x.shape) - 2)
    if left or right:
        x = ops.pad(x, widths)
    tail = tuple(ops.shape(x)[a] if x.shape[a] is None else x.shape[a] for a in range(2, len(x.shape)))
    x = ops.reshape(x, (ops.shape(x)[0], -1, block) + tail)
    if left + right == 0:
        return x
    return ops.concatenate([x[:, offset : offset + num_blocks] for offset in range(left + right + 1)], axis=2)


def _cyclic_neighbours(blocks, left, right, concatenate=ops.concatenate):
    """`(B, num_blocks, block, …)` → `(B, num_blocks, (left + 1 + right)·block, …)`:
    for block `k`, blocks `k − left … k + right` counted cyclically (the
    first block's left neighbour is the last block), exactly as trax's and
    transformers' `look_adjacent`: the shift by `o` is the slice pair
    `[o:], [:o]`, so a shift by more than the number of blocks is no shift.
    `concatenate` is `np.concatenate` for numpy positions."""
    if left + right == 0:
        return blocks
    shifted = []
    for offset in range(-left, right + 1):
        shifted.append(blocks if offset == 0 else concatenate([blocks[:, offset:], blocks[:, :offset]], axis=1))
    return concatenate(shifted, axis=2)


def _pad_length(x, padding):
    """`x` padded with `padding` zero positions at the end of axis 1."""
    if isinstance(padding, int) and padding == 0:
        return x
    return ops.pad(x, [[0, 0], [0, padding]] + [[0, 0]] * (len(x.shape) - 2))


def _num_blocks(length, block):
    if isinstance(length, int):
        return -(-length // block)
    return (length + block - 1) // block


def _attend_blocks(query_blocks, key_memory, value_memory, mask, batch, dropout_rate, training, seed_generator, scale):
    """Softmax attention of `(B, blocks, q, N, d)` queries over their
    `(B, blocks, M, N, d)` memories under a boolean `mask` broadcastable to
    `(B, N, blocks, q, M)` (given as `(B or 1, N or 1, blocks, q, M)`);
    returns `(B, blocks·q, N, d_v)`."""
    num_blocks, q_len = query_blocks.shape[1], query_blocks.shape[2]
    num_blocks = ops.shape(query_blocks)[1] if num_blocks is None else num_blocks
    heads, depth = query_blocks.shape[3], query_blocks.shape[4]
    memory, value_depth = key_memory.shape[2], value_memory.shape[4]
    folded_query = ops.reshape(query_blocks, (-1, q_len, heads, depth))
    folded_key = ops.reshape(key_memory, (-1, memory, heads, depth))
    folded_value = ops.reshape(value_memory, (-1, memory, heads, value_depth))
    mask_heads = mask.shape[1]
    mask = ops.transpose(mask, (0, 2, 1, 3, 4))  # (B or 1, blocks, N or 1, q, M)
    mask = ops.broadcast_to(mask, (batch, num_blocks, mask_heads, q_len, memory))
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


# --- 1D -------------------------------------------------------------------


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
        length: number of keys `L` (positions `0 … L − 1`).
        block_size, num_memory_blocks, is_causal: as in `local_attention`.
        query_offset: absolute position of the first query row (an int or
            an int32 scalar tensor).
        query_length: number of query rows; defaults to `length`.
        num_memory_blocks_after, cyclic: as in `local_attention`; with
            `cyclic` the blocks are the `⌈L/b⌉` blocks of `L` positions,
            counted modulo their number (`length` and `block_size` must
            then be Python ints). Where a window holds one block more than
            once (fewer blocks than the window has) `local_attention` counts
            its keys as often; this pattern shows them once.

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
        num_blocks = _num_blocks(length, block_size)
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
        _length(key_cache), block_size, num_memory_blocks, is_causal,
        query_offset=query_offset, query_length=_length(query),
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
        query: `(B, L, N, D)`.
        key: `(B, L, N, D)` (self-attention: the same length as `query`).
        value: `(B, L, N, M)`.
        attention_mask: boolean, broadcastable to `(B, N, L, L)`; intersected
            with the local window (key-padding masks are cheapest).
        is_causal: the left flank only, and `j ≤ i`.
        dropout_rate: dropout on the attention probabilities while training
            (as in `softmax_attention`).
        training: whether dropout is active.
        seed_generator: a `keras.random.SeedGenerator` for the dropout.
        block_size: query block length `b` (at most `L` is used, which
            changes nothing but the padding).
        num_memory_blocks: neighbouring blocks `m` on each side (left only
            when causal); 0 attends within the block only.
        scale: logit scale; defaults to `1 / sqrt(D)`.
        num_memory_blocks_after: blocks `a` after the query block, if not
            `m` (non-causal only: under `is_causal` later blocks are in the
            future, unless `cyclic` wraps them round). The Reformer's
            `local_num_chunks_after`, with `num_memory_blocks` its
            `local_num_chunks_before`.
        cyclic: count neighbouring blocks cyclically, as the Reformer does
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
    _check_self_attention(query, key, value, "Local")
    length = _length(query)
    block = max(1, min(int(block_size), length)) if isinstance(length, int) else int(block_size)
    num_blocks = _num_blocks(length, block)
    padding = num_blocks * block - length
    left, right = _flanks(num_memory_blocks, num_memory_blocks_after, is_causal, cyclic)
    if cyclic and isinstance(num_blocks, int) and num_blocks == 1:
        left = right = 0  # the neighbours would all be this block again
    memory = (left + right + 1) * block
    batch = ops.shape(query)[0]

    query_blocks = _pad_length(query, padding)
    query_blocks = ops.reshape(query_blocks, (batch, -1, block) + tuple(query.shape[2:]))
    if cyclic:
        key_memory, value_memory = (
            _cyclic_neighbours(
                ops.reshape(_pad_length(x, padding), (batch, -1, block) + tuple(x.shape[2:])), left, right
            )
            for x in (key, value)
        )
    else:
        key_memory = _blocks_with_neighbours(_pad_length(key, padding), num_blocks, block, left, right)
        value_memory = _blocks_with_neighbours(_pad_length(value, padding), num_blocks, block, left, right)

    # Positions and the window: numpy constants for a static length (built
    # once when traced), keras.ops for a dynamic one.
    xp = np if isinstance(length, int) else ops
    block_index = xp.arange(num_blocks)[:, None, None]
    query_position = block_index * block + xp.arange(block)[None, :, None]  # (blocks, b, 1)
    if cyclic:
        positions = xp.reshape(xp.arange(num_blocks * block), (1, num_blocks, block))
        key_position = _cyclic_neighbours(positions, left, right, xp.concatenate)[0][:, None, :]  # (blocks, 1, M)
    else:
        key_position = (block_index - left) * block + xp.arange(memory)[None, None, :]  # (blocks, 1, M)
    visible = xp.logical_and(key_position >= 0, key_position < length)
    if is_causal:
        visible = xp.logical_and(visible, key_position <= query_position)
    # Padded queries attend to everything in their window: never a fully masked row.
    query_padding = query_position >= length
    if attention_mask is not None:
        user = _mask_4d(attention_mask, length, length)
        last = length - 1
        user = _gather_mask(user, ops.minimum(query_position, last), ops.clip(key_position, 0, last))
        visible = ops.logical_or(ops.logical_and(user, visible), query_padding)
    else:
        visible = xp.logical_or(visible, query_padding)[None, None]
    output = _attend_blocks(
        query_blocks, key_memory, value_memory, visible, batch, dropout_rate, training, seed_generator, scale
    )
    return output[:, :length]


# --- 2D -------------------------------------------------------------------


def _pair(value, name):
    try:
        pair = tuple(int(v) for v in value)
    except TypeError:
        pair = (int(value), int(value))
    if len(pair) != 2:
        raise ValueError(f"{name} must be a pair (height, width); got {value!r}.")
    return pair


class _Geometry2D:
    """Static indices and masks of local 2D attention (numpy, computed once).

    Attributes:
        query_index: `(blocks, q)` sequence position of each query slot
            (padding slots repeat a real position).
        query_padding: `(blocks, q)` True for slots outside the image.
        key_index: `(blocks, M)` sequence position of each memory slot
            (slots outside the image repeat a real position).
        key_valid: `(blocks, M)` True for memory slots inside the image.
        order: `(q, M)` True where the memory slot is at or before the query
            slot in sequence order (all True when not causal); the same for
            every block.
        output_index: `(L,)` for each sequence position, its flat query slot
            `block·q + slot`.
    """

    def __init__(self, image_shape, block_shape, memory_flange, is_causal, layout):
        if layout not in LAYOUTS:
            raise ValueError(f"Unknown layout '{layout}'; expected one of {', '.join(LAYOUTS)}.")
        height, width = _pair(image_shape, "image_shape")
        block_h, block_w = _pair(block_shape, "block_shape")
        flange_h, flange_w = _pair(memory_flange, "memory_flange")
        if min(height, width, block_h, block_w) < 1 or min(flange_h, flange_w) < 0:
            raise ValueError(
                f"image_shape and block_shape must be positive and memory_flange non-negative; got "
                f"{image_shape}, {block_shape} and {memory_flange}."
            )
        if layout == "block_raster":
            if height % block_h or width % block_w:
                raise ValueError(
                    f"layout='block_raster' needs the image {height}×{width} to be tiled exactly by "
                    f"{block_h}×{block_w} blocks."
                )
        else:  # A block larger than the image sees the same memory as one of the image's size.
            block_h, block_w = min(block_h, height), min(block_w, width)
        blocks_h, blocks_w = -(-height // block_h), -(-width // block_w)
        memory_h = block_h + flange_h + (0 if is_causal else flange_h)
        memory_w = block_w + 2 * flange_w

        def sequence_position(rows, cols):
            if layout == "raster":
                return rows * width + cols
            block = (rows // block_h) * blocks_w + cols // block_w
            return block * (block_h * block_w) + (rows % block_h) * block_w + cols % block_w

        def per_block(rows, cols):
            """(blocks_h, a) rows and (blocks_w, b) cols → (blocks, a·b) grids."""
            shape = (blocks_h, blocks_w, rows.shape[1], cols.shape[1])
            grid_rows = np.broadcast_to(rows[:, None, :, None], shape).reshape(blocks_h * blocks_w, -1)
            grid_cols = np.broadcast_to(cols[None, :, None, :], shape).reshape(blocks_h * blocks_w, -1)
            return grid_rows, grid_cols

        query_rows, query_cols = per_block(
            np.arange(blocks_h)[:, None] * block_h + np.arange(block_h),
            np.arange(blocks_w)[:, None] * block_w + np.arange(block_w),
        )
        key_rows, key_cols = per_block(
            np.arange(blocks_h)[:, None] * block_h - flange_h + np.arange(memory_h),
            np.arange(blocks_w)[:, None] * block_w - flange_w + np.arange(memory_w),
        )
        query_inside = (query_rows < height) & (query_cols < width)
        self.query_padding = ~query_inside
        self.key_valid = (key_rows >= 0) & (key_rows < height) & (key_cols >= 0) & (key_cols < width)
        self.query_index = sequence_position(np.minimum(query_rows, height - 1), np.minimum(query_cols, width - 1))
        self.key_index = sequence_position(np.clip(key_rows, 0, height - 1), np.clip(key_cols, 0, width - 1))
        flat_slot = np.arange(self.query_index.size).reshape(self.query_index.shape)
        self.output_index = np.empty(height * width, np.int64)
        self.output_index[self.query_index[query_inside]] = flat_slot[query_inside]

        # Sequence order is the same comparison, slot against slot, in every
        # block (both layouts order the pixels lexicographically by a key that
        # depends only on the offset from the block's corner).
        query_y = np.repeat(np.arange(block_h), block_w)[:, None]
        query_x = np.tile(np.arange(block_w), block_h)[:, None]
        key_y = np.repeat(np.arange(memory_h) - flange_h, memory_w)[None, :]
        key_x = np.tile(np.arange(memory_w) - flange_w, memory_h)[None, :]
        if not is_causal:
            order = np.ones((block_h * block_w, memory_h * memory_w), bool)
        elif layout == "raster":
            order = (key_y < query_y) | ((key_y == query_y) & (key_x <= query_x))
        else:
            key_order = (key_y // block_h, key_x // block_w, key_y % block_h, key_x % block_w)
            query_order = (np.zeros_like(query_y), np.zeros_like(query_x), query_y, query_x)
            order = np.zeros(np.broadcast_shapes(query_y.shape, key_y.shape), bool)
            decided = np.zeros_like(order)
            for key_part, query_part in zip(key_order, query_order):
                order |= ~decided & (key_part < query_part)
                decided |= key_part != query_part
            order |= ~decided  # equal: the query itself
        self.order = order
        self.length = height * width

    def dense(self):
        """The `(L, L)` boolean pattern (numpy)."""
        visible = self.key_valid[:, None, :] & self.order[None] & ~self.query_padding[:, :, None]
        mask = np.zeros((self.length, self.length), bool)
        blocks, rows, slots = np.nonzero(visible)
        mask[self.query_index[blocks, rows], self.key_index[blocks, slots]] = True
        return mask


def local_mask_2d(
    image_shape,
    block_shape=DEFAULT_BLOCK_SHAPE,
    memory_flange=DEFAULT_MEMORY_FLANGE,
    is_causal=False,
    layout="raster",
):
    """The dense boolean `(H·W, H·W)` pattern of `local_attention_2d`.

    O(L²) memory: for tests, visualisation and decoding against a key/value
    cache, not for the forward pass.
    """
    return ops.convert_to_tensor(_Geometry2D(image_shape, block_shape, memory_flange, is_causal, layout).dense())


@register_mechanism("local_2d")
def local_attention_2d(
    query,
    key,
    value,
    attention_mask=None,
    is_causal=False,
    dropout_rate=0.0,
    training=False,
    seed_generator=None,
    image_shape=None,
    block_shape=DEFAULT_BLOCK_SHAPE,
    memory_flange=DEFAULT_MEMORY_FLANGE,
    layout="raster",
    scale=None,
):
    """Local 2D attention over an image flattened to `(batch, H·W, num_heads, head_dim)`.

    Query blocks of `block_shape` pixels attend to the block extended by
    `memory_flange = (f_h, f_w)` pixels to the top, left, right and (unless
    causal) bottom; with `is_causal` only to memory at or before the query in
    the sequence order named by `layout`. See the module docstring. Equal to
    softmax attention under `local_mask_2d(image_shape, block_shape,
    memory_flange, is_causal, layout)`.

    Args:
        query: `(B, H·W, N, D)`, pixels in `layout` order.
        key: `(B, H·W, N, D)`.
        value: `(B, H·W, N, M)`.
        attention_mask: boolean, broadcastable to `(B, N, H·W, H·W)`, in
            sequence order; intersected with the local window.
        is_causal: top/left/right memory only, and only positions at or
            before the query in sequence order.
        dropout_rate: dropout on the attention probabilities while training
            (as in `softmax_attention`).
        training: whether dropout is active.
        seed_generator: a `keras.random.SeedGenerator` for the dropout.
        image_shape: `(H, W)`; required.
        block_shape: query block `(b_h, b_w)`.
        memory_flange: `(f_h, f_w)`.
        layout: `"raster"` (row after row) or `"block_raster"` (the Image
            Transformer's generation order: blocks in raster order, raster
            order within a block).
        scale: logit scale; defaults to `1 / sqrt(D)`.

    Returns:
        `(B, H·W, N, M)`.

    Example:

    >>> import numpy as np
    >>> q = np.random.rand(2, 6 * 5, 4, 8).astype("float32")
    >>> out = local_attention_2d(q, q, q, image_shape=(6, 5), block_shape=(2, 2), memory_flange=(1, 1))
    >>> tuple(out.shape)
    (2, 30, 4, 8)
    """
    if image_shape is None:
        raise ValueError(
            "local_attention_2d needs image_shape=(height, width), the image the sequence holds "
            "(e.g. attention='local_2d' with image_shape passed through to the mechanism)."
        )
    _check_self_attention(query, key, value, "Local 2D")
    geometry = _Geometry2D(image_shape, block_shape, memory_flange, is_causal, layout)
    length = query.shape[1]
    if length is not None and length != geometry.length:
        raise ValueError(
            f"The sequence length {length} is not the number of pixels of image_shape {tuple(image_shape)} "
            f"({geometry.length})."
        )
    batch = ops.shape(query)[0]
    query_index = ops.convert_to_tensor(geometry.query_index.astype("int32"))
    key_index = ops.convert_to_tensor(geometry.key_index.astype("int32"))

    query_blocks = ops.take(query, query_index, axis=1)  # (B, blocks, q, N, D)
    key_memory = ops.take(key, key_index, axis=1)  # (B, blocks, M, N, D)
    value_memory = ops.take(value, key_index, axis=1)

    visible = ops.logical_and(
        ops.convert_to_tensor(geometry.key_valid[:, None, :]), ops.convert_to_tensor(geometry.order[None])
    )
    if attention_mask is not None:
        user = _mask_4d(attention_mask, geometry.length, geometry.length)
        user = _gather_mask(user, query_index[:, :, None], key_index[:, None, :])
        visible = ops.logical_and(user, visible)
    else:
        visible = visible[None, None]
    visible = ops.logical_or(visible, ops.convert_to_tensor(geometry.query_padding[:, :, None]))
    output = _attend_blocks(
        query_blocks, key_memory, value_memory, visible, batch, dropout_rate, training, seed_generator, scale
    )  # (B, blocks·q, N, M)
    return ops.take(output, ops.convert_to_tensor(geometry.output_index.astype("int32")), axis=1)


register_decoding("local", KeyValueCache(_attend_over_cache))
