"""`classification_head`: dropout, an optional hidden layer, logits, under
the names that checkpoint converters and presets read."""

import keras
import numpy as np

from attention_zoo_keras.layers.classification_head import classification_head


def _layers(inputs, logits):
    return {layer.name: layer for layer in keras.Model(inputs, logits).layers[1:]}


def test_linear_head_names_and_shape():
    pooled = keras.Input((6,))
    logits = classification_head(pooled, 3, 0.1, "glorot_uniform")
    layers = _layers(pooled, logits)
    assert list(layers) == ["classifier_dropout", "classifier"]
    assert layers["classifier"].kernel.shape == (6, 3)
    assert tuple(logits.shape) == (None, 3)


def test_hidden_layer_names_and_widths():
    pooled = keras.Input((4,))
    logits = classification_head(
        pooled, 5, 0.1, "glorot_uniform", name="vqa", output_name="vqa_logits", hidden_dim=8,
        layer_norm_epsilon=1e-6,
    )
    layers = _layers(pooled, logits)
    assert list(layers) == ["vqa_dropout", "vqa_hidden", "vqa_hidden_norm", "vqa_logits"]
    assert layers["vqa_hidden"].kernel.shape == (4, 8)
    assert layers["vqa_hidden_norm"].epsilon == 1e-6
    assert layers["vqa_logits"].kernel.shape == (8, 5)


def test_computes_dense_of_the_features_at_inference():
    pooled = keras.Input((4,))
    model = keras.Model(pooled, classification_head(pooled, 2, 0.5, "glorot_uniform"))
    x = np.random.default_rng(0).normal(size=(3, 4)).astype("float32")
    kernel, bias = (keras.ops.convert_to_numpy(w) for w in model.get_layer("classifier").weights)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(model(x, training=False)), x @ kernel + bias, rtol=1e-5)


def test_acts_on_the_last_axis_with_one_initializer_copy_per_dense():
    initializer = keras.initializers.TruncatedNormal(stddev=0.02)
    features = keras.Input((7, 4))
    logits = classification_head(features, 1, 0.0, initializer, dtype="float16", name="region", hidden_dim=4)
    layers = _layers(features, logits)
    assert tuple(logits.shape) == (None, 7, 1)
    assert all(layer.dtype_policy.name == "float16" for layer in layers.values())
    kernels = [layers["region_hidden"].kernel_initializer, layers["region"].kernel_initializer]
    assert kernels[0] is not kernels[1] and initializer not in kernels
