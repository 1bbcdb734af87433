"""Softmax attention against the formula softmax(QKᵀ/√d + M)V in numpy."""

import keras
import numpy as np
import pytest

from attention_zoo_keras import attention


def reference_attention(query, key, value, mask=None):
    """numpy: (B, T, N, H) inputs, boolean mask broadcastable to (B, N, T, S)."""
    logits = np.einsum("btnh,bsnh->bnts", query, key) / np.sqrt(query.shape[-1])
    if mask is not None:
        logits = np.where(mask, logits, -np.inf)
    logits -= logits.max(-1, keepdims=True)
    weights = np.exp(logits)
    weights /= weights.sum(-1, keepdims=True)
    return np.einsum("bnts,bsnh->btnh", weights, value)


@pytest.fixture
def qkv():
    rng = np.random.default_rng(0)
    return [rng.standard_normal((2, 5, 3, 4)).astype("float32") for _ in range(3)]


def test_matches_formula_without_mask(qkv):
    out = attention.softmax_attention(*qkv)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(out), reference_attention(*qkv), atol=1e-5)


def test_padding_mask(qkv):
    padding = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
    mask = padding[:, None, None, :]
    out = keras.ops.convert_to_numpy(attention.softmax_attention(*qkv, attention_mask=mask))
    np.testing.assert_allclose(out, reference_attention(*qkv, mask), atol=1e-5)
    # Changing padded keys/values does not change the output.
    query, key, value = qkv
    key2, value2 = key.copy(), value.copy()
    key2[0, 3:] = 100.0
    value2[0, 3:] = -100.0
    out2 = keras.ops.convert_to_numpy(attention.softmax_attention(query, key2, value2, attention_mask=mask))
    np.testing.assert_allclose(out2[0], out[0], atol=1e-5)


def test_causal(qkv):
    out = keras.ops.convert_to_numpy(attention.softmax_attention(*qkv, is_causal=True))
    causal = np.tril(np.ones((5, 5), bool))
    np.testing.assert_allclose(out, reference_attention(*qkv, causal), atol=1e-5)


def test_causal_and_padding_combined(qkv):
    padding = np.array([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0]], bool)[:, None, None, :]
    out = attention.softmax_attention(*qkv, attention_mask=padding, is_causal=True)
    mask = np.logical_and(padding, np.tril(np.ones((5, 5), bool)))
    np.testing.assert_allclose(keras.ops.convert_to_numpy(out), reference_attention(*qkv, mask), atol=1e-5)


def test_causal_mask_aligns_last_query_with_last_key():
    mask = keras.ops.convert_to_numpy(attention.causal_mask(2, 4))
    np.testing.assert_array_equal(mask, [[True, True, True, False], [True, True, True, True]])


def _spy_on_the_fused_kernel(monkeypatch):
    """Records the calls of the kernel `softmax_attention` uses: torch's
    `scaled_dot_product_attention` (called directly), elsewhere
    `keras.ops.dot_product_attention`."""
    calls = []
    if keras.backend.backend() == "torch":
        import torch

        owner, name = torch.nn.functional, "scaled_dot_product_attention"
    else:
        owner, name = keras.ops, "dot_product_attention"
    kernel = getattr(owner, name)

    def spy(*args, **kwargs):
        calls.append((args, kwargs))
        return kernel(*args, **kwargs)

    monkeypatch.setattr(owner, name, spy)
    return calls


def test_inference_uses_fused_kernel(qkv, monkeypatch):
    calls = _spy_on_the_fused_kernel(monkeypatch)
    attention.softmax_attention(*qkv, dropout_rate=0.5, training=False)
    assert len(calls) == 1
    attention.softmax_attention(*qkv, dropout_rate=0.5, training=True, seed_generator=keras.random.SeedGenerator(1))
    if keras.backend.backend() == "torch":
        assert len(calls) == 2 and calls[1][1]["dropout_p"] == 0.5, "torch's fused kernel drops out itself"
    else:
        assert len(calls) == 1, "attention dropout: the einsum path"


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="torch's kernel is called directly")
def test_torch_kernel_reads_the_inputs_in_place(qkv, monkeypatch):
    """Keras' torch `dot_product_attention` copies query, key and value to
    contiguous memory when a mask keeps the flash kernel out; called
    directly, the kernel reads transposed views of them."""
    calls = _spy_on_the_fused_kernel(monkeypatch)
    query, key, value = (keras.ops.convert_to_tensor(t) for t in qkv)
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)[:, None, None, :]
    attention.softmax_attention(query, key, value, attention_mask=mask)
    (kernel_query, kernel_key, kernel_value), _ = calls[0]
    for given, seen in ((query, kernel_query), (key, kernel_key), (value, kernel_value)):
        assert seen.data_ptr() == given.data_ptr() and not seen.is_contiguous()


def test_dropout_path_at_negligible_rate_equals_inference_path(qkv):
    """A negligible dropout rate takes the training path (torch's fused kernel
    with dropout, or the einsum path), which must agree with the inference
    kernel under padding and causal masks."""
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)[:, None, None, :]
    fused = keras.ops.convert_to_numpy(attention.softmax_attention(*qkv, attention_mask=mask, is_causal=True))
    explicit = keras.ops.convert_to_numpy(
        attention.softmax_attention(
            *qkv, attention_mask=mask, is_causal=True, dropout_rate=1e-9, training=True,
            seed_generator=keras.random.SeedGenerator(0),
        )
    )
    np.testing.assert_allclose(explicit, fused, atol=1e-5)


def test_dropout_changes_output_when_training(qkv):
    dropped = attention.softmax_attention(
        *qkv, dropout_rate=0.5, training=True, seed_generator=keras.random.SeedGenerator(0)
    )
    assert not np.allclose(keras.ops.convert_to_numpy(dropped), reference_attention(*qkv), atol=1e-3)


def test_registry_lookup_and_unknown_name():
    assert attention.get_mechanism("softmax") is attention.softmax_attention
    assert "softmax" in attention.mechanism_names()
    with pytest.raises(ValueError, match="Unknown attention mechanism 'sofmax'.*softmax"):
        attention.get_mechanism("sofmax")


def test_dropout_is_inverted_and_only_drops_probabilities():
    """E[output] is unchanged by dropout (kept probabilities are scaled by
    1/(1-rate)): with all-ones values each output is Σ kept p/(1-rate)."""
    rng = np.random.default_rng(0)
    query = rng.standard_normal((4, 64, 8, 4)).astype("float32")
    key = rng.standard_normal((4, 64, 8, 4)).astype("float32")
    value = np.ones((4, 64, 8, 4), "float32")
    keras.utils.set_random_seed(0)
    out = keras.ops.convert_to_numpy(
        attention.softmax_attention(
            query, key, value, dropout_rate=0.25, training=True, seed_generator=keras.random.SeedGenerator(0)
        )
    )
    assert abs(out.mean() - 1.0) < 0.01
    assert out.std() > 0.05  # not the identity: probabilities were dropped



@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_attention_is_float32_attention_rounded(dtype):
    """On every backend, compiled (`predict`) as well as eager; under JAX on
    a CPU XLA's `dot_general` refuses float16 matrices multiplied into
    float32, so there float16 attention is computed in float32."""
    from attention_zoo_keras.models import GPTBackbone
    from attention_zoo_keras.models import GPTCausalLM

    arguments = dict(vocabulary_size=30, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16,
                     max_sequence_length=16)
    keras.utils.set_random_seed(0)
    full = GPTCausalLM(GPTBackbone(**arguments))
    half = GPTCausalLM(GPTBackbone(**arguments, dtype=dtype))
    half.set_weights([keras.ops.convert_to_numpy(weight) for weight in full.weights])
    x = {"token_ids": np.array([[3, 4, 5, 6, 7], [8, 9, 10, 0, 0]], "int32"),
         "padding_mask": np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], "int32")}
    expected = full.predict(x, verbose=0)
    actual = half.predict(x, verbose=0)
    assert keras.backend.standardize_dtype(actual.dtype) == dtype
    np.testing.assert_allclose(np.asarray(actual, "float32"), expected, atol=0.03, rtol=0.03)
