"""The Reformer's input padding at inference (transformers'
`_pad_to_mult_of_chunk_length`): LSH and local attention cut the sequence
into chunks, so a sequence longer than the shortest chunk length must be a
multiple of every chunk length (their least common multiple),

    padded(L) = L                         if L ≤ min(c) or lcm(c) | L
              = ⌈L / lcm(c)⌉ · lcm(c)     otherwise

While training a length that needs padding is an error; at inference the
inputs are padded (padding tokens masked out, and in LSH put in a bucket of
their own) and the outputs cut back (`CutToLength`).
"""

import math

import keras
import numpy as np
from keras import ops

from attention_zoo_keras.registration import register


def padded_length(length, chunk_lengths):
    """The length transformers pads a sequence of `length` tokens to at
    inference: unchanged up to the shortest chunk length (every layer then
    attends over the whole sequence) and for multiples of all of them,
    otherwise the next multiple of their least common multiple.

    Args:
        length: int or int32 scalar tensor. The sequence length (a tensor
            where it is unknown while tracing; the result is one then).
        chunk_lengths: list of int. The chunk lengths of the layers.

    >>> padded_length(5, [4, 8]), padded_length(4, [4, 8]), padded_length(16, [4, 8])
    (8, 4, 16)
    """
    if not chunk_lengths:
        return length
    multiple = math.lcm(*chunk_lengths)
    rounded_up = -(-length // multiple) * multiple
    if isinstance(length, (int, np.integer)):
        return length if length <= min(chunk_lengths) else rounded_up
    return ops.where(length <= min(chunk_lengths), length, rounded_up)


@register
class ChunkPadding(keras.layers.Layer):
    """Pads `token_ids` and `padding_mask` `(batch, length)` on the right to
    `padded_length(length, chunk_lengths)` (ids `pad_token_id`, mask 0) at
    inference, also where the length is unknown while tracing (a
    TensorFlow graph of any width, e.g. an exported serving signature);
    while training a length that would need padding is an error, and the
    length must be static.

    Args:
        chunk_lengths: list of int. The chunk lengths of the layers.
        pad_token_id: int. The id of the padding tokens.
    """

    def __init__(self, chunk_lengths, pad_token_id=0, **kwargs):
        super().__init__(**kwargs)
        self.chunk_lengths = [int(c) for c in chunk_lengths]
        self.pad_token_id = pad_token_id

    def call(self, token_ids, padding_mask, training=None):
        length = token_ids.shape[1]
        if length is None and training:
            raise ValueError(
                "While training, the Reformer needs a static sequence length (a multiple of the chunk lengths); "
                f"got token_ids of shape {tuple(token_ids.shape)}. Batches padded to varying widths (a "
                'preprocessor with padding="buckets") reach a TensorFlow graph with an unknown width: use '
                'padding="max_length".'
            )
        if length is None:  # unknown while tracing: padded by an amount computed in the graph
            length = ops.shape(token_ids)[1]
        padding = padded_length(length, self.chunk_lengths) - length
        if isinstance(padding, int) and padding == 0:
            return token_ids, padding_mask
        if training:
            multiple = math.lcm(*self.chunk_lengths)
            raise ValueError(
                f"While training, the sequence length {length} must be a multiple of the chunk lengths' least "
                f"common multiple {multiple} (chunk lengths {self.chunk_lengths}); pad the inputs to "
                f"{length + padding}."
            )
        token_ids = ops.pad(token_ids, [[0, 0], [0, padding]], constant_values=self.pad_token_id)
        padding_mask = ops.pad(padding_mask, [[0, 0], [0, padding]])
        return token_ids, padding_mask

    def compute_output_spec(self, token_ids, padding_mask):
        return (
            keras.KerasTensor((token_ids.shape[0], None), dtype=token_ids.dtype),
            keras.KerasTensor((padding_mask.shape[0], None), dtype=padding_mask.dtype),
        )

    def get_config(self):
        config = super().get_config()
        config.update({"chunk_lengths": self.chunk_lengths, "pad_token_id": self.pad_token_id})
        return config


@register
class CutToLength(keras.layers.Layer):
    """`x[:, :length]` with `length` that of `reference` (undoes `ChunkPadding`)."""

    def call(self, x, reference):
        return x[:, : ops.shape(reference)[1]]

    def compute_output_spec(self, x, reference):
        return keras.KerasTensor((x.shape[0], reference.shape[1]) + tuple(x.shape[2:]), dtype=x.dtype)
