"""Sinusoidal position encodings (Vaswani et al., 2017, §3.5):

    PE(t, 2i)   = sin(t / 10000^(2i/d))
    PE(t, 2i+1) = cos(t / 10000^(2i/d))

Fixed, not learned, so a model can read positions beyond those seen in
training. Two layouts of the same numbers exist: the paper's, sines and
cosines interleaved (`"interleaved"`), and tensor2tensor's, all sines then
all cosines (`"concatenated"`), which Marian, fairseq and `transformers`'
Marian models use.
"""

import keras
import numpy as np
from keras import ops

from attention_zoo_keras.registration import register

LAYOUTS = ("interleaved", "concatenated")


def sinusoidal_table(positions, hidden_dim, layout="interleaved", max_wavelength=10000.0):
    """`(len(positions), hidden_dim)` float64 numpy table of the encodings.

    >>> sinusoidal_table([0, 1], 4).round(4).tolist()
    [[0.0, 1.0, 0.0, 1.0], [0.8415, 0.5403, 0.01, 1.0]]
    >>> sinusoidal_table([1], 4, layout="concatenated").round(4).tolist()
    [[0.8415, 0.01, 0.5403, 1.0]]
    """
    if layout not in LAYOUTS:
        raise ValueError(f"Unknown sinusoid layout '{layout}'; expected one of {LAYOUTS}.")
    positions = np.asarray(positions, dtype="float64")[:, None]
    frequencies = max_wavelength ** (-np.arange(0, hidden_dim, 2, dtype="float64") / hidden_dim)
    angles = positions * frequencies[None, :]
    sines, cosines = np.sin(angles), np.cos(angles)[:, : hidden_dim // 2]
    if layout == "concatenated":
        return np.concatenate([sines, cosines], axis=-1)
    table = np.zeros((len(positions), hidden_dim))
    table[:, 0::2] = sines
    table[:, 1::2] = cosines
    return table


@register
class SinusoidalPositionEmbedding(keras.layers.Layer):
    """Returns the encodings of positions `start, …, start + length − 1`.

    The table for `max_sequence_length` positions is computed once in
    float64, rounded to float32 and kept as a constant (the layer has no
    weights).

    Args:
        max_sequence_length: int. The number of positions in the table.
        hidden_dim: int. The encoding width.
        layout: str. `"interleaved"` (the paper) or `"concatenated"`
            (Marian).
        max_wavelength: float. The base of the geometric progression
            (10000).

    Call args:
        inputs: tensor of shape `(batch, length, ...)`. Only its length is
            used.
        start_index: int or int tensor. The first position (for
            incremental decoding).

    Returns:
        `(1, length, hidden_dim)`, to be added to token embeddings.

    Example:

    >>> import numpy as np
    >>> layer = SinusoidalPositionEmbedding(max_sequence_length=16, hidden_dim=4)
    >>> encodings = ops.convert_to_numpy(layer(np.zeros((2, 3), "int32")))
    >>> encodings.shape, bool(np.allclose(encodings[0, 1], sinusoidal_table([1], 4)[0]))
    ((1, 3, 4), True)
    """

    def __init__(self, max_sequence_length, hidden_dim, layout="interleaved", max_wavelength=10000.0, **kwargs):
        super().__init__(**kwargs)
        self.max_sequence_length = max_sequence_length
        self.hidden_dim = hidden_dim
        self.layout = layout
        self.max_wavelength = max_wavelength
        self._table = sinusoidal_table(np.arange(max_sequence_length), hidden_dim, layout, max_wavelength).astype(
            "float32"
        )

    def call(self, inputs, start_index=0):
        length = ops.shape(inputs)[1]
        table = ops.cast(ops.convert_to_tensor(self._table), self.compute_dtype)
        positions = ops.take(table, start_index + ops.arange(length), axis=0)
        return ops.expand_dims(positions, 0)

    def compute_output_shape(self, input_shape):
        return (1, input_shape[1], self.hidden_dim)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "max_sequence_length": self.max_sequence_length,
                "hidden_dim": self.hidden_dim,
                "layout": self.layout,
                "max_wavelength": self.max_wavelength,
            }
        )
        return config
