"""Local 2D attention — Parmar, Vaswani, Uszkoreit, Kaiser, Shazeer, Ku
and Tran, 2018, "Image Transformer" (ICML 2018), §3.2: block-local softmax
attention (`local.py`) on an image of `image_shape = (H, W)` positions
flattened into a sequence,

    O_i = Σ_{j ∈ M(i)} softmax_j(q_i·k_j / √d + mask_ij) v_j

Query blocks are `block_shape = (b_h, b_w)` rectangles; each attends to the
rectangle around it widened by `memory_flange = (f_h, f_w)` (only the rows
above and its own under `is_causal`, in the sequence order that `layout`
names: raster, or the Image Transformer's block raster). Computed blockwise
with `softmax_attention`: time O(B·N·L·M·d), M = (b_h + 2f_h)(b_w + 2f_w).

`docs/attention/local_2d.md` holds the whole description: the memory
rectangles, the two layouts and causality, the computation and masks.
"""

import numpy as np
from keras import ops

from attention_zoo_keras.attention.blocks import attend_blocks
from attention_zoo_keras.attention.blocks import check_self_attention
from attention_zoo_keras.attention.masks import gather_mask
from attention_zoo_keras.attention.masks import mask_4d
from attention_zoo_keras.attention.registry import register_mechanism

DEFAULT_BLOCK_SHAPE = (8, 16)  # tensor2tensor's query_shape default
DEFAULT_MEMORY_FLANGE = (8, 16)  # tensor2tensor's memory_flange default
LAYOUTS = ("raster", "block_raster")


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
        query_index: int array of shape `(blocks, q)`. The sequence
            position of each query slot (padding slots repeat a real
            position).
        query_padding: bool array of shape `(blocks, q)`. True for slots
            outside the image.
        key_index: int array of shape `(blocks, M)`. The sequence position
            of each memory slot (slots outside the image repeat a real
            position).
        key_valid: bool array of shape `(blocks, M)`. True for memory slots
            inside the image.
        order: bool array of shape `(q, M)`. True where the memory slot is
            at or before the query slot in sequence order (all True when not
            causal); the same for every block.
        output_index: int array of shape `(L,)`. For each sequence position,
            its flat query slot `block·q + slot`.
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
    the sequence order named by `layout`. See `docs/attention/local_2d.md`. Equal to
    softmax attention under `local_mask_2d(image_shape, block_shape,
    memory_flange, is_causal, layout)`.

    Args:
        query: tensor of shape `(B, H·W, N, D)`. The queries, pixels in
            `layout` order.
        key: tensor of shape `(B, H·W, N, D)`. The keys.
        value: tensor of shape `(B, H·W, N, M)`. The values.
        attention_mask: bool tensor or None. Broadcastable to
            `(B, N, H·W, H·W)`, in sequence order; intersected with the local
            window.
        is_causal: bool. Top/left/right memory only, and only positions at
            or before the query in sequence order.
        dropout_rate: float. Dropout on the attention probabilities while
            training (as in `softmax_attention`).
        training: bool. Whether dropout is active.
        seed_generator: `keras.random.SeedGenerator` or None. The dropout's
            seed generator.
        image_shape: tuple of int. `(H, W)`; required.
        block_shape: tuple of int, or int. The query block `(b_h, b_w)`.
        memory_flange: tuple of int, or int. `(f_h, f_w)`.
        layout: str. `"raster"` (row after row) or `"block_raster"` (the
            Image Transformer's generation order: blocks in raster order,
            raster order within a block).
        scale: float or None. The logit scale; `None`: `1 / sqrt(D)`.

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
    check_self_attention(query, key, value, "Local 2D")
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
        user = mask_4d(attention_mask, geometry.length, geometry.length)
        user = gather_mask(user, query_index[:, :, None], key_index[:, None, :])
        visible = ops.logical_and(user, visible)
    else:
        visible = visible[None, None]
    visible = ops.logical_or(visible, ops.convert_to_tensor(geometry.query_padding[:, :, None]))
    output = attend_blocks(
        query_blocks, key_memory, value_memory, visible, batch, dropout_rate, training, seed_generator, scale
    )  # (B, blocks·q, N, M)
    return ops.take(output, ops.convert_to_tensor(geometry.output_index.astype("int32")), axis=1)
