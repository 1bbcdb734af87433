"""Boolean attention masks, shared by the mechanisms.

A mask is `True` where a query may attend to a key, broadcastable to
`(batch, num_heads, query_length, key_length)`. This module builds the
causal pattern and the mask of per-row key lengths, brings user masks to
rank 4, reads a mask at the (query, key) pairs a blockwise mechanism
visits, and gives the logit that stands for "masked" under softmax, and
the softmax over the keys.
"""

from keras import ops


def causal_mask(query_length, key_length, offset=None):
    """Boolean `(query_length, key_length)`: query i sees keys j ≤ i + offset.

    `offset` is the absolute position of the first query. It defaults to
    `key_length − query_length`, aligning the last query with the last key;
    decoding into a fixed-size key/value cache passes the write position.

    >>> import keras
    >>> keras.ops.convert_to_numpy(causal_mask(2, 3)).tolist()
    [[True, True, False], [True, True, True]]
    """
    if offset is None:
        offset = key_length - query_length
    query_positions = ops.arange(query_length)[:, None] + offset
    key_positions = ops.arange(key_length)[None, :]
    return query_positions >= key_positions


def relative_distances(query_length, key_length, query_offset):
    """`(T, S)` int32: key position minus query position, `j − (i + offset)`,
    with the queries at absolute positions `query_offset …` (the distances
    relative-position mechanisms index their tables by)."""
    query_positions = ops.arange(query_length, dtype="int32") + ops.cast(query_offset, "int32")
    key_positions = ops.arange(key_length, dtype="int32")
    return key_positions[None, :] - query_positions[:, None]


def key_length_mask(key_lengths, key_length):
    """Boolean `(batch, 1, 1, key_length)`: row b's queries see the keys
    before `key_lengths[b]` (a right-padded row's tokens).

    >>> import keras
    >>> keras.ops.convert_to_numpy(key_length_mask([1, 3], 3))[:, 0, 0].tolist()
    [[True, False, False], [True, True, True]]
    """
    lengths = ops.cast(ops.convert_to_tensor(key_lengths), "int32")
    return ops.arange(key_length, dtype="int32")[None, None, None, :] < lengths[:, None, None, None]


def masked_logit(dtype):
    """A logit that vanishes under softmax yet keeps fully masked rows
    finite: −1e9, or −3e4 in float16 (whose range ends at 65504)."""
    return ops.cast(-3e4 if dtype == "float16" else -1e9, dtype)


def softmax_last_axis(logits):
    """`softmax(logits)` over the last axis. Over one key (the first token
    decoded with an empty memory, a top-k of 1) every weight is 1, computed
    as `exp(l − l)`: the same values and zero gradient, without Keras'
    warning that a softmax over an axis of size 1 is likely a mistake.

    >>> import keras, numpy as np
    >>> [keras.ops.convert_to_numpy(softmax_last_axis(np.zeros((1, n), "float32"))).tolist() for n in (1, 2)]
    [[[1.0]], [[0.5, 0.5]]]
    """
    if logits.shape[-1] == 1:
        return ops.exp(logits - logits)
    return ops.softmax(logits, axis=-1)


def mask_4d(attention_mask, query_length, key_length):
    """`attention_mask` as a boolean `(B or 1, N or 1, T or 1, S or 1)` tensor.

    Args:
        attention_mask: bool (or 0/1) tensor of rank 1 to 4. Broadcastable
            to `(batch, num_heads, query_length, key_length)`.
        query_length: int or None. The length its query axis must have (or
            1); `None` (or a traced size) is not checked.
        key_length: int or None. The length its key axis must have (or 1);
            `None` (or a traced size) is not checked.

    Raises:
        ValueError: for a rank outside 1…4, or a query or key axis of
            another size, naming both shapes.
    """
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


def gather_mask(mask, query_index, key_index):
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
        return _take_on_axis_2(mask[:, :, 0, :], key_index)
    if not full_key:
        return _take_on_axis_2(mask[:, :, :, 0], query_index)
    key_length = mask.shape[3] if mask.shape[3] is not None else ops.shape(mask)[3]
    flat = ops.reshape(mask, (ops.shape(mask)[0], ops.shape(mask)[1], -1))
    return _take_on_axis_2(flat, query_index * key_length + key_index)


def _take_on_axis_2(x, index):
    """`ops.take(x, index, axis=2)` for `x` of rank 3: `x.shape[:2] +
    index.shape`. Written as a `take_along_axis` of the flattened index,
    because torch's `take` ends in a `squeeze` of that axis (a no-op in
    torch) which torch's ONNX exporter turns into an invalid ONNX `Squeeze`."""
    index = ops.convert_to_tensor(index)
    gathered = ops.take_along_axis(x, ops.reshape(index, (1, 1, -1)), axis=2)
    return ops.reshape(gathered, (*ops.shape(x)[:2], *ops.shape(index)))
