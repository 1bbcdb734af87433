"""Patch embedding (Dosovitskiy et al., 2021, "An Image is Worth 16x16 Words:
Transformers for Image Recognition at Scale", §3.1):

    z_i = vec(x_p^i) E + b,   i = 1..N,   N = ⌊H / P_h⌋ · ⌊W / P_w⌋

where x_p^i is the i-th non-overlapping P_h × P_w × C patch of the image, in
row-major order, and E ∈ R^{(P_h·P_w·C) × D}. The weights are those of one
convolution whose kernel and stride are the patch size (the reference
implementation's); the layer computes it as the matrix product of the
flattened patches with the kernel, the same numbers, and several times
faster than a strided convolution's kernel on a CPU (torch on a shared 2-core
x86 CPU: 2.5 against 17 ms for the forward and backward pass of 32 images of
16 × 16 in 4 × 4 patches; a micro-measurement, not a benchmark against peers).
Pixels past the last whole patch are dropped, as in the reference.
"""

import numbers

import keras
from keras import ops

from attention_zoo_keras.layers.initializers import clone_initializer
from attention_zoo_keras.registration import register


def as_pair(value, name):
    """`(height, width)` from an int (a square) or a pair of positive ints.

    Example:

    >>> as_pair(16, "patch_size"), as_pair([32, 48], "image_size")
    ((16, 16), (32, 48))
    """
    pair = (value, value) if isinstance(value, numbers.Integral) else value
    if (
        not isinstance(pair, (list, tuple))
        or len(pair) != 2
        or not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) and v > 0 for v in pair)
    ):
        raise ValueError(f"{name} must be a positive int or a (height, width) pair of positive ints; got {value!r}.")
    return tuple(int(v) for v in pair)


@register
class PatchEmbedding(keras.layers.Layer):
    """Cuts images into patches and projects each patch to `hidden_dim`.

    Args:
        patch_size: int or tuple of two int. The patch height and width
            (one int: a square).
        hidden_dim: int. The width of each patch embedding.
        kernel_initializer: str or keras.initializers.Initializer. The
            initializer of the projection kernel.

    Call args:
        images: tensor of shape `(batch, height, width, channels)`. The
            images, channels last.

    Returns:
        `(batch, num_patches, hidden_dim)`, patches in row-major order
        (`num_patches = (height // patch_height) * (width // patch_width)`).

    Example:

    >>> import numpy as np
    >>> layer = PatchEmbedding(patch_size=4, hidden_dim=8)
    >>> tuple(layer(np.zeros((2, 16, 12, 3), "float32")).shape)
    (2, 12, 8)
    """

    def __init__(self, patch_size, hidden_dim, kernel_initializer="glorot_uniform", **kwargs):
        super().__init__(**kwargs)
        self.patch_size = as_pair(patch_size, "patch_size")
        self.hidden_dim = hidden_dim
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.projection = keras.layers.Conv2D(
            hidden_dim,
            kernel_size=self.patch_size,
            strides=self.patch_size,
            padding="valid",
            data_format="channels_last",
            kernel_initializer=clone_initializer(kernel_initializer),
            dtype=self.dtype_policy,
            name="projection",
        )

    def build(self, input_shape):
        self.projection.build(input_shape)

    def call(self, images):
        (patch_height, patch_width), channels = self.patch_size, self.projection.kernel.shape[2]
        grid_height = ops.shape(images)[1] // patch_height
        grid_width = ops.shape(images)[2] // patch_width
        images = images[:, : grid_height * patch_height, : grid_width * patch_width, :]
        patches = ops.reshape(images, (-1, grid_height, patch_height, grid_width, patch_width, channels))
        patches = ops.transpose(patches, (0, 1, 3, 2, 4, 5))  # (batch, grid rows, grid columns, P_h, P_w, C)
        patches = ops.reshape(patches, (-1, grid_height * grid_width, patch_height * patch_width * channels))
        kernel = ops.reshape(self.projection.kernel, (patch_height * patch_width * channels, self.hidden_dim))
        return ops.matmul(patches, kernel) + self.projection.bias

    def compute_output_shape(self, input_shape):
        height, width = input_shape[1], input_shape[2]
        if height is None or width is None:
            return (input_shape[0], None, self.hidden_dim)
        num_patches = (height // self.patch_size[0]) * (width // self.patch_size[1])
        return (input_shape[0], num_patches, self.hidden_dim)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "patch_size": self.patch_size,
                "hidden_dim": self.hidden_dim,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            }
        )
        return config
