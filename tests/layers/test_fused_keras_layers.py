"""The library's `Dense` and `LayerNormalization` compute what Keras' do
(float32, bfloat16, mixed precision, LoRA, int8 quantization), keep Keras'
names and weights, and under torch run the fused kernels
(`torch.nn.functional.linear` / `layer_norm`)."""

import keras
import numpy as np
import pytest

from attention_zoo_keras.layers.fused_keras_layers import Dense
from attention_zoo_keras.layers.fused_keras_layers import LayerNormalization

TORCH = keras.backend.backend() == "torch"
INPUTS = np.random.default_rng(0).normal(size=(2, 5, 8)).astype("float32")


def _pair(ours, theirs, shape=(None, 5, 8)):
    """`ours` and Keras' `theirs`, built, with the same random weights."""
    ours.build(shape)
    theirs.build(shape)
    rng = np.random.default_rng(1)
    weights = [rng.normal(size=w.shape).astype(keras.backend.standardize_dtype(w.dtype)) for w in ours.weights]
    ours.set_weights(weights)
    theirs.set_weights(weights)
    return ours, theirs


def _numpy(x):
    return keras.ops.convert_to_numpy(keras.ops.cast(x, "float32"))


@pytest.mark.parametrize("dtype, tolerance", [("float32", 1e-6), ("bfloat16", 3e-2), ("mixed_bfloat16", 3e-2)])
@pytest.mark.parametrize("use_bias, activation", [(True, None), (False, "gelu")])
def test_dense_computes_keras_dense(dtype, tolerance, use_bias, activation):
    ours, theirs = _pair(
        Dense(4, use_bias=use_bias, activation=activation, dtype=dtype),
        keras.layers.Dense(4, use_bias=use_bias, activation=activation, dtype=dtype),
    )
    np.testing.assert_allclose(_numpy(ours(INPUTS)), _numpy(theirs(INPUTS)), atol=tolerance, rtol=tolerance)
    assert ours(INPUTS).dtype == theirs(INPUTS).dtype


@pytest.mark.parametrize("dtype, tolerance", [("float32", 1e-5), ("bfloat16", 5e-2), ("mixed_bfloat16", 5e-2)])
def test_layer_normalization_computes_keras_layer_normalization(dtype, tolerance):
    ours, theirs = _pair(
        LayerNormalization(epsilon=1e-5, dtype=dtype), keras.layers.LayerNormalization(epsilon=1e-5, dtype=dtype)
    )
    x = keras.ops.cast(INPUTS * 3.0 + 1.0, "bfloat16" if dtype == "bfloat16" else "float32")
    np.testing.assert_allclose(_numpy(ours(x)), _numpy(theirs(x)), atol=tolerance, rtol=tolerance)
    assert ours(x).dtype == theirs(x).dtype


def test_layer_normalization_without_scale_or_offset_is_keras():
    for options in ({"center": False}, {"scale": False}, {"rms_scaling": True}):
        ours, theirs = _pair(LayerNormalization(**options), keras.layers.LayerNormalization(**options))
        np.testing.assert_allclose(_numpy(ours(INPUTS)), _numpy(theirs(INPUTS)), atol=1e-5)


def test_names_and_weights_are_keras():
    dense, norm = Dense(4), LayerNormalization()
    dense.build((None, 8))
    norm.build((None, 8))
    assert dense.name.startswith("dense") and norm.name.startswith("layer_normalization")
    assert [w.path.split("/")[-1] for w in dense.weights] == ["kernel", "bias"]
    assert [w.path.split("/")[-1] for w in norm.weights] == ["gamma", "beta"]
    assert isinstance(dense, keras.layers.Dense) and isinstance(norm, keras.layers.LayerNormalization)


def test_lora_and_int8_quantization_compute_what_keras_computes():
    ours, theirs = _pair(Dense(4), keras.layers.Dense(4))
    for layer in (ours, theirs):
        layer.enable_lora(2, a_initializer="ones", b_initializer="ones")
    np.testing.assert_allclose(_numpy(ours(INPUTS)), _numpy(theirs(INPUTS)), atol=1e-5)
    ours, theirs = _pair(Dense(4), keras.layers.Dense(4))
    for layer in (ours, theirs):
        layer.quantize("int8")
    np.testing.assert_allclose(_numpy(ours(INPUTS)), _numpy(theirs(INPUTS)), atol=1e-6)


@pytest.mark.skipif(not TORCH, reason="the fused kernels are torch's")
def test_torch_runs_the_fused_kernels(monkeypatch):
    import torch

    called = []
    for name in ("linear", "layer_norm"):
        original = getattr(torch.nn.functional, name)
        monkeypatch.setattr(
            torch.nn.functional, name, lambda *a, _f=original, _n=name, **k: called.append(_n) or _f(*a, **k)
        )
    dense, norm = _pair(Dense(4), keras.layers.Dense(4))[0], LayerNormalization()
    norm(dense(INPUTS))
    assert called == ["linear", "layer_norm"]
