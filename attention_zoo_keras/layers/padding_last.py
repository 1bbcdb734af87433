"""Each row's padding moved after its tokens, so that attention is given
key lengths instead of a mask.

An encoder whose positions enter with its embeddings (softmax attention
over the keys, position-wise layer norms and feed-forward layers, no
positions inside the blocks) is permutation-equivariant: reordering a
row's positions reorders its outputs alike. So any padding mask can be
turned into right padding before the blocks and the order restored after
them:

    X'_b = X_b[order_b],   H'_b = Blocks(X'_b; keys < L_b),   H_b = H'_b[destination_b]

where `L_b` is the number of tokens of row `b`, `order_b` lists the
positions of its tokens, then those of its padding (each in their order),
and `destination_b` is its inverse (where each position went). In the
reordered rows every key at index ≥ `L_b` is padding, so the attention is
given the lengths alone (`key_lengths`): JAX's cuDNN kernel then skips the
padded keys' blocks and reads no mask (a (T, S) bias per row otherwise;
`backend_support.fused_dot_product_attention`), the other kernels get the
mask the lengths imply. A row without tokens keeps its order and its whole
length: its queries attend to all its positions (under a mask they average
them; either way its outputs are padding's).

The reordering is a gather of `(batch, length, width)` hidden states, and
its gradient the gather by the inverse order (`PermutePositions`), not the
scatter-add that differentiating a gather gives by default (atomic adds on a
GPU).
"""

import keras
from keras import ops

from attention_zoo_keras import backend_support
from attention_zoo_keras.layers.attention_maps import active_recorder


def padding_last_order(padding_mask):
    """`(order, destination, key_lengths)` for a `(batch, length)` padding
    mask (nonzero: a token).

    `order[b, s]` is the position that goes to index `s` of row `b` (its
    tokens first, then its padding, each in order); `destination[b, t]`
    the index position `t` goes to (the inverse permutation); `key_lengths[b]`
    the row's number of tokens, or its length where it has none. All int32.

    >>> import numpy as np
    >>> order, destination, lengths = padding_last_order(np.array([[0, 1, 1, 0], [1, 1, 0, 0]]))
    >>> [keras.ops.convert_to_numpy(t).tolist() for t in (order, destination, lengths)]
    [[[1, 2, 0, 3], [0, 1, 2, 3]], [[2, 0, 1, 3], [0, 1, 2, 3]], [2, 2]]
    """
    tokens = ops.cast(ops.cast(padding_mask, "bool"), "int32")
    token_counts = ops.sum(tokens, axis=1)
    destination = ops.where(
        tokens > 0,
        ops.cumsum(tokens, axis=1) - 1,
        token_counts[:, None] + ops.cumsum(1 - tokens, axis=1) - 1,
    )
    order = backend_support.argsort_distinct(destination)
    key_lengths = ops.where(token_counts > 0, token_counts, ops.sum(1 - tokens, axis=1))  # (no tokens: all padding)
    return order, ops.cast(destination, "int32"), ops.cast(key_lengths, "int32")


class PermutePositions(keras.layers.Layer):
    """`x[b, order[b, s]]` for every row `b` and index `s` of a `(batch,
    length, ...)` tensor; its gradient is the gather by `inverse_order`.

    Under `layers.attention_maps` the recorder is told the order of the
    positions its maps see, and puts them back in the inputs' order.

    Example:

    >>> import numpy as np
    >>> order, destination, _ = padding_last_order(np.array([[0, 1, 1]]))
    >>> x = np.arange(3, dtype="float32").reshape(1, 3, 1)
    >>> keras.ops.convert_to_numpy(PermutePositions()(x, order, destination))[0, :, 0].tolist()
    [1.0, 2.0, 0.0]
    """

    def call(self, x, order, inverse_order):
        recorder = active_recorder()
        if recorder is not None and backend_support.is_concrete(x):
            recorder.reorder_positions(keras.ops.convert_to_numpy(order))
        permute = backend_support.custom_gradient_from_outputs(_gather_forward, _gather_backward)
        if permute is None:
            return _take_positions(x, order)
        return permute([x], [], [order, inverse_order])[0]

    def compute_output_shape(self, input_shape, *args):
        return input_shape


def _take_positions(x, order):
    index = ops.reshape(order, tuple(ops.shape(order)) + (1,) * (len(x.shape) - 2))
    return ops.take_along_axis(x, index, axis=1)


def _gather_forward(inputs, params, constants):
    return [_take_positions(inputs[0], constants[0])]


def _gather_backward(outputs, params, constants, output_grads):
    return [_take_positions(output_grads[0], constants[1])], []
