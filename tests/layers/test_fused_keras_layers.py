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


@pytest.mark.skipif(keras.backend.backend() != "jax", reason="the two-row product is JAX's on a GPU")
@pytest.mark.parametrize("dtype, tolerance", [("float32", 1e-6), ("mixed_bfloat16", 3e-2)])
def test_a_single_row_computed_as_two_on_a_jax_gpu_is_keras_dense(monkeypatch, dtype, tolerance):
    """Under JAX on a GPU one row is projected as two (XLA would make a
    slow multiply-and-reduce of a vector-by-matrix product); made to here,
    on a CPU. Every other shape is left to Keras."""
    import jax

    from attention_zoo_keras.backend_support import dense_kernels

    monkeypatch.setattr(dense_kernels, "jax_compiles_for_gpu", lambda: True)
    products = []
    matmul = keras.ops.matmul
    monkeypatch.setattr(keras.ops, "matmul", lambda a, b: products.append(tuple(a.shape)) or matmul(a, b))
    ours, theirs = _pair(Dense(4, activation="gelu", dtype=dtype), keras.layers.Dense(4, activation="gelu", dtype=dtype))
    for inputs in (INPUTS[:1, :1], INPUTS[0, :1], INPUTS[:1]):
        expected = _numpy(theirs(inputs))
        products.clear()
        got = ours(inputs)
        np.testing.assert_allclose(_numpy(got), expected, atol=tolerance, rtol=tolerance)
        assert got.shape == expected.shape and got.dtype == theirs(inputs).dtype
        assert products == ([(2, 8)] if inputs.shape[:-1] in ((1, 1), (1,)) else [])  # (Keras' own matmul unseen)
    compiled = jax.jit(lambda x: ours(x))  # shapes are static when traced too
    np.testing.assert_allclose(_numpy(compiled(INPUTS[:1, :1])), _numpy(theirs(INPUTS[:1, :1])), atol=tolerance)


@pytest.mark.skipif(keras.backend.backend() != "jax", reason="the two-row product is JAX's on a GPU")
def test_batch_of_one_generation_with_two_row_products_gives_the_same_tokens(monkeypatch):
    import attention_zoo_keras as azk
    from attention_zoo_keras.backend_support import dense_kernels
    from tests.support.tiny_models import tiny_gpt

    prompt = {"token_ids": np.array([[5, 6, 7, 8]], "int32"), "padding_mask": np.ones((1, 4), bool)}

    def generated():
        keras.utils.set_random_seed(0)
        lm = azk.models.GPTCausalLM(tiny_gpt(vocabulary_size=97, max_sequence_length=32), preprocessor=None)
        return lm.generate(prompt, max_length=20, stop_token_ids=None, return_scores=True)

    expected = generated()
    monkeypatch.setattr(dense_kernels, "jax_compiles_for_gpu", lambda: True)
    got = generated()
    np.testing.assert_array_equal(got["token_ids"], expected["token_ids"])
    np.testing.assert_allclose(got["scores"], expected["scores"], atol=1e-5)
