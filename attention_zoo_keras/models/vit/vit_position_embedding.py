"""ViT's learned position embeddings (Dosovitskiy et al., 2021, "An Image is
Worth 16x16 Words", §3.1 and §3.2) and their resizing to another image size.

    z_0 = [x_class; x_p^1 E; …; x_p^N E] + E_pos,   E_pos ∈ R^{(1 + N) × D}

The N patch positions form a grid_h × grid_w grid. Fine-tuning or running at
another resolution keeps the class position and resizes the grid "by 2D
interpolation of the pre-trained position embeddings, according to their
location in the original image" (§3.2). The interpolation here is bicubic,
computed exactly as `torch.nn.functional.interpolate(grid, size=(h, w),
mode="bicubic", align_corners=False)` — what `transformers`' ViT does with
`interpolate_pos_encoding=True` — so converted models match it: output index
i reads the source at s = (i + ½)·in/out − ½ through Keys' cubic convolution
kernel with a = −0.75 over the taps ⌊s⌋−1 … ⌊s⌋+2, clamped to the border:

    w(x) = (a+2)|x|³ − (a+3)|x|² + 1          for |x| ≤ 1
    w(x) = a|x|³ − 5a|x|² + 8a|x| − 4a        for 1 < |x| < 2

The class position and the patch grid are separate weights, so a checkpoint's
grid shape is in its weights: no guessing it from a row count (a 4×4 and a 2×8
grid both have 16 rows).
"""

import keras
import numpy as np
from keras import ops

from attention_zoo_keras.layers.initializers import clone_initializer
from attention_zoo_keras.layers.patch_embedding import as_pair
from attention_zoo_keras.registration import register

CUBIC_A = -0.75


def _cubic_tap_weights(fraction):
    """Weights of the taps ⌊s⌋−1, ⌊s⌋, ⌊s⌋+1, ⌊s⌋+2 for `fraction = s − ⌊s⌋`."""

    def near(x):  # |x| ≤ 1
        return ((CUBIC_A + 2) * x - (CUBIC_A + 3)) * x * x + 1

    def far(x):  # 1 < |x| < 2
        return ((CUBIC_A * x - 5 * CUBIC_A) * x + 8 * CUBIC_A) * x - 4 * CUBIC_A

    return np.stack([far(fraction + 1), near(fraction), near(1 - fraction), far(2 - fraction)], axis=-1)


def _bicubic_matrix(in_size, out_size):
    """`(out_size, in_size)` matrix resizing one axis (`align_corners=False`)."""
    source = (np.arange(out_size) + 0.5) * (in_size / out_size) - 0.5
    first = np.floor(source)
    taps = np.clip(first.astype(np.int64)[:, None] + np.arange(-1, 3), 0, in_size - 1)
    matrix = np.zeros((out_size, in_size))
    rows = np.repeat(np.arange(out_size), 4)
    np.add.at(matrix, (rows, taps.ravel()), _cubic_tap_weights(source - first).ravel())
    return matrix


def resize_patch_positions(positions, grid_size):
    """Resizes a grid of position embeddings bicubically, as torch does.

    Runs in numpy (float64) when weights are loaded, never inside a model.

    Args:
        positions: array of shape `(grid_height, grid_width, dim)`. The patch
            positions.
        grid_size: int or tuple of int. The new `(grid_height, grid_width)`
            (or an int for a square).

    Returns:
        `(new_grid_height, new_grid_width, dim)`, in `positions`' dtype.

    Example:

    >>> import numpy as np
    >>> grid = np.arange(12, dtype="float32").reshape(2, 3, 2)
    >>> resize_patch_positions(grid, (4, 6)).shape
    (4, 6, 2)
    >>> bool(np.array_equal(resize_patch_positions(grid, (2, 3)), grid))
    True
    """
    grid_size = as_pair(grid_size, "grid_size")
    if np.ndim(positions) != 3:
        raise ValueError(
            f"positions must be (grid_height, grid_width, dim); got shape {tuple(np.shape(positions))}."
        )
    dtype = positions.dtype if np.issubdtype(positions.dtype, np.floating) else np.float32
    positions = np.asarray(positions, dtype=np.float64)
    rows = _bicubic_matrix(positions.shape[0], grid_size[0])
    columns = _bicubic_matrix(positions.shape[1], grid_size[1])
    return np.einsum("ih,jw,hwd->ijd", rows, columns, positions).astype(dtype)


@register
class ViTPositionEmbedding(keras.layers.Layer):
    """Learned positions of a class token followed by a grid of patches.

    Args:
        grid_size: int or tuple of int. The `(grid_height, grid_width)` of
            the patch grid (or an int).
        hidden_dim: int. The embedding width.
        initializer: str or `keras.initializers.Initializer`. The initializer
            of both weights.

    Weights: `class_position` `(hidden_dim,)` and `patch_positions`
    `(grid_height, grid_width, hidden_dim)`.

    Call args:
        inputs: tensor of shape `(batch, 1 + grid_height * grid_width,
            hidden_dim)`. Only its shape is used.

    Returns:
        `(1, 1 + grid_height * grid_width, hidden_dim)`, to be added to the
        class token and patch embeddings.

    Example:

    >>> import numpy as np
    >>> layer = ViTPositionEmbedding(grid_size=(2, 3), hidden_dim=8)
    >>> tuple(layer(np.zeros((4, 7, 8), "float32")).shape)
    (1, 7, 8)
    """

    def __init__(self, grid_size, hidden_dim, initializer="glorot_uniform", **kwargs):
        super().__init__(**kwargs)
        self.grid_size = as_pair(grid_size, "grid_size")
        self.hidden_dim = hidden_dim
        self.initializer = keras.initializers.get(initializer)

    def build(self, input_shape=None):
        self.class_position = self.add_weight(
            name="class_position", shape=(self.hidden_dim,), initializer=clone_initializer(self.initializer)
        )
        self.patch_positions = self.add_weight(
            name="patch_positions",
            shape=(*self.grid_size, self.hidden_dim),
            initializer=clone_initializer(self.initializer),
        )

    def call(self, inputs):
        num_patches = self.grid_size[0] * self.grid_size[1]
        patches = ops.reshape(self.patch_positions, (num_patches, self.hidden_dim))
        positions = ops.concatenate([ops.expand_dims(self.class_position, 0), patches], axis=0)
        return ops.expand_dims(ops.cast(positions, self.compute_dtype), 0)

    def compute_output_shape(self, input_shape):
        return (1, 1 + self.grid_size[0] * self.grid_size[1], self.hidden_dim)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "grid_size": self.grid_size,
                "hidden_dim": self.hidden_dim,
                "initializer": keras.initializers.serialize(self.initializer),
            }
        )
        return config
