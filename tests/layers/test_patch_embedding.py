"""`PatchEmbedding` computes the patch-size convolution of ViT as a matrix
product: the same numbers as the convolution with its weights."""

import keras
import numpy as np
import pytest

from attention_zoo_keras.layers import PatchEmbedding


@pytest.mark.parametrize("image_shape, patch_size", [((16, 12, 3), 4), ((17, 13, 2), (4, 3)), ((8, 8, 1), 8)])
def test_equals_the_strided_convolution_with_its_weights(image_shape, patch_size):
    images = np.random.default_rng(0).normal(size=(2, *image_shape)).astype("float32")
    layer = PatchEmbedding(patch_size=patch_size, hidden_dim=5, kernel_initializer="random_normal")
    outputs = keras.ops.convert_to_numpy(layer(images))
    convolution = keras.layers.Conv2D(5, kernel_size=layer.patch_size, strides=layer.patch_size, padding="valid")
    convolution.build(images.shape)
    convolution.set_weights([keras.ops.convert_to_numpy(weight) for weight in layer.projection.weights])
    expected = keras.ops.convert_to_numpy(convolution(images))
    np.testing.assert_allclose(outputs, expected.reshape(2, -1, 5), atol=1e-5)
    assert outputs.shape == (2, (image_shape[0] // layer.patch_size[0]) * (image_shape[1] // layer.patch_size[1]), 5)


def test_mixed_precision_computes_in_the_compute_dtype():
    layer = PatchEmbedding(patch_size=4, hidden_dim=8, dtype="mixed_bfloat16")
    outputs = layer(np.ones((1, 8, 8, 3), "float32"))
    assert keras.backend.standardize_dtype(outputs.dtype) == "bfloat16"
    assert layer.projection.kernel.dtype == "float32"
