"""Learned absolute position embeddings (Devlin et al., 2019; Radford et al., 2018):

    x'ₜ = xₜ + Pₜ,   P ∈ R^{max_length × d} learned.
"""

import keras
from keras import ops

from attention_zoo_keras.registration import register


@register
class PositionEmbedding(keras.layers.Layer):
    """Returns the learned embedding of positions `start, …, start + length − 1`.

    Args:
        sequence_length: int. The largest number of positions.
        hidden_dim: int. The width of each position's vector.
        initializer: str or keras.initializers.Initializer. The initializer
            of the table.

    Call args:
        inputs: tensor of shape `(batch, length, ...)`. Only its length is
            used.
        start_index: int or int tensor. The first position (for incremental
            decoding).

    Returns:
        `(1, length, dim)`, to be added to token embeddings.

    Example:

    >>> import numpy as np
    >>> layer = PositionEmbedding(sequence_length=16, hidden_dim=8)
    >>> tuple(layer(np.zeros((2, 5), "int32")).shape)
    (1, 5, 8)
    """

    def __init__(self, sequence_length, hidden_dim, initializer="glorot_uniform", **kwargs):
        super().__init__(**kwargs)
        self.sequence_length = sequence_length
        self.hidden_dim = hidden_dim
        self.initializer = keras.initializers.get(initializer)

    def build(self, input_shape=None):
        self.embeddings = self.add_weight(
            name="embeddings",
            shape=(self.sequence_length, self.hidden_dim),
            initializer=self.initializer,
        )

    def call(self, inputs, start_index=0):
        length = ops.shape(inputs)[1]
        positions = ops.take(self.embeddings, start_index + ops.arange(length), axis=0)
        return ops.expand_dims(ops.cast(positions, self.compute_dtype), 0)

    def compute_output_shape(self, input_shape):
        return (1, input_shape[1], self.hidden_dim)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "sequence_length": self.sequence_length,
                "hidden_dim": self.hidden_dim,
                "initializer": keras.initializers.serialize(self.initializer),
            }
        )
        return config
