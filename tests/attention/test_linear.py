"""Linear attention (Katharopoulos et al., 2020) against the paper's
quadratic form in numpy:

    V'_i = Σ_j sim(i, j) V_j / (Σ_j sim(i, j) + eps),  sim(i, j) = φ(Q_i)ᵀφ(K_j) · mask(i, j)

with mask(i, j) = [j ≤ i] under causality and the key-padding mask; eps = 1e-6
added to the denominator, no 1/√d scaling (the authors' `fast-transformers`).
"""

import keras
import numpy as np
import pytest

from attention_zoo_keras import backend_support
from attention_zoo_keras.attention import get_mechanism
from attention_zoo_keras.attention import linear
from attention_zoo_keras.attention import linear_decoding
from tests.support.attention_gradients import gradients

EPS = 1e-6


def elu_plus_one(x):
    return np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))


def reference(query, key, value, causal=False, key_padding=None, feature=elu_plus_one, eps=EPS):
    """numpy float64 quadratic form; `key_padding` boolean `(B, S)`."""
    query, key, value = (np.asarray(t, np.float64) for t in (query, key, value))
    similarity = np.einsum("btnd,bsnd->bnts", feature(query), feature(key))
    if causal:
        similarity = similarity * np.tril(np.ones(similarity.shape[-2:]))
    if key_padding is not None:
        similarity = similarity * key_padding[:, None, None, :]
    numerator = np.einsum("bnts,bsnm->btnm", similarity, value)
    denominator = similarity.sum(-1).transpose(0, 2, 1)[..., None]
    return numerator / (denominator + eps)


def numpy(x):
    return keras.ops.convert_to_numpy(x)


def random_qkv(batch=2, length=7, heads=3, dim=4, value_dim=None, key_length=None, seed=0):
    rng = np.random.default_rng(seed)
    key_length = length if key_length is None else key_length
    value_dim = dim if value_dim is None else value_dim
    return (
        rng.standard_normal((batch, length, heads, dim)).astype("float32"),
        rng.standard_normal((batch, key_length, heads, dim)).astype("float32"),
        rng.standard_normal((batch, key_length, heads, value_dim)).astype("float32"),
    )


def test_registered_as_linear():
    assert get_mechanism("linear") is linear.linear_attention


def test_non_causal_matches_quadratic_form():
    q, k, v = random_qkv(length=5, key_length=9, value_dim=6)  # cross-attention, value_dim != key_dim
    out = linear.linear_attention(q, k, v)
    assert tuple(out.shape) == (2, 5, 3, 6)
    np.testing.assert_allclose(numpy(out), reference(q, k, v), atol=1e-5)


@pytest.mark.parametrize("chunk_size", [1, 2, 3, 4, 5, 10, 64])
def test_causal_matches_quadratic_form(chunk_size):
    q, k, v = random_qkv(length=10, value_dim=5)  # 3 and 4 do not divide 10; 64 > 10
    out = linear.linear_attention(q, k, v, is_causal=True, chunk_size=chunk_size)
    np.testing.assert_allclose(numpy(out), reference(q, k, v, causal=True), atol=1e-5)


@pytest.mark.parametrize("is_causal", [False, True])
def test_key_padding_removes_keys(is_causal):
    q, k, v = random_qkv(length=6)
    padding = np.array([[1, 1, 1, 1, 0, 0], [0, 1, 1, 1, 1, 1]], bool)  # right- and left-padded
    mask = padding[:, None, None, :]
    out = numpy(linear.linear_attention(q, k, v, attention_mask=mask, is_causal=is_causal, chunk_size=4))
    expected = reference(q, k, v, causal=is_causal, key_padding=padding)
    np.testing.assert_allclose(out, expected, atol=1e-5)
    k2, v2 = k.copy(), v.copy()
    k2[~padding] = 50.0
    v2[~padding] = -1e4
    out2 = numpy(linear.linear_attention(q, k2, v2, attention_mask=mask, is_causal=is_causal, chunk_size=4))
    np.testing.assert_allclose(out2, out, atol=1e-5)


def test_key_padding_mask_shapes():
    q, k, v = random_qkv(length=5)
    padding = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
    expected = reference(q, k, v, key_padding=padding)
    for mask in (padding[:, None, None, :], np.broadcast_to(padding[:, None, None, :], (2, 3, 1, 5))):
        np.testing.assert_allclose(numpy(linear.linear_attention(q, k, v, attention_mask=mask)), expected, atol=1e-5)
    shared = np.array([1, 1, 1, 1, 0], bool)  # (S,): the same padding for every row
    np.testing.assert_allclose(
        numpy(linear.linear_attention(q, k, v, attention_mask=shared)),
        reference(q, k, v, key_padding=np.stack([shared, shared])),
        atol=1e-5,
    )


def test_general_mask_is_rejected():
    q, k, v = random_qkv(length=4)
    general = np.tril(np.ones((4, 4), bool))[None, None]
    with pytest.raises(ValueError, match="only key-padding masks"):
        linear.linear_attention(q, k, v, attention_mask=general)


def test_causal_needs_equal_lengths():
    q, k, v = random_qkv(length=3, key_length=5)
    with pytest.raises(ValueError, match="query_length == key_length"):
        linear.linear_attention(q, k, v, is_causal=True)


def test_recurrent_step_equals_causal_form_at_every_position():
    q, k, v = random_qkv(length=9, value_dim=5)
    padding = np.array([[1] * 9, [1] * 6 + [0] * 3], bool)
    mask = padding[:, None, None, :]
    causal = numpy(linear.linear_attention(q, k, v, attention_mask=mask, is_causal=True, chunk_size=4))
    state = linear_decoding.linear_attention_initial_state(2, 3, 4, 5)
    for t in range(9):
        out, state = linear_decoding.linear_attention_step(
            q[:, t : t + 1], k[:, t : t + 1], v[:, t : t + 1], state, key_mask=padding[:, t]
        )
        assert tuple(out.shape) == (2, 1, 3, 5)
        np.testing.assert_allclose(numpy(out)[:, 0], causal[:, t], atol=1e-5, err_msg=f"position {t}")
    assert keras.backend.standardize_dtype(state[0].dtype) == "float32"


def test_prefill_state_then_steps_equals_causal_form():
    q, k, v = random_qkv(length=8)
    full = numpy(linear.linear_attention(q, k, v, is_causal=True, chunk_size=3))
    prefix, state = linear.causal_linear_attention(q[:, :5], k[:, :5], v[:, :5], chunk_size=2, return_state=True)
    np.testing.assert_allclose(numpy(prefix), full[:, :5], atol=1e-5)
    # The state equals the one the steps build.
    stepped = linear_decoding.linear_attention_initial_state(2, 3, 4, 4)
    for t in range(5):
        _, stepped = linear_decoding.linear_attention_step(q[:, t : t + 1], k[:, t : t + 1], v[:, t : t + 1], stepped)
    for a, b in zip(state, stepped):
        np.testing.assert_allclose(numpy(a), numpy(b), rtol=1e-5, atol=1e-5)
    # Continue with a chunked pass from the state, then with steps.
    middle, state = linear.causal_linear_attention(
        q[:, 5:7], k[:, 5:7], v[:, 5:7], initial_state=state, return_state=True
    )
    np.testing.assert_allclose(numpy(middle), full[:, 5:7], atol=1e-5)
    last, _ = linear_decoding.linear_attention_step(q[:, 7:], k[:, 7:], v[:, 7:], state)
    np.testing.assert_allclose(numpy(last), full[:, 7:], atol=1e-5)


def test_step_takes_one_position():
    q, k, v = random_qkv(length=2)
    with pytest.raises(ValueError, match="one position"):
        linear_decoding.linear_attention_step(q, k, v, linear_decoding.linear_attention_initial_state(2, 3, 4, 4))


@pytest.mark.parametrize("is_causal", [False, True])
def test_feature_maps_by_name_and_callable(is_causal):
    q, k, v = random_qkv(length=6)
    out = linear.linear_attention(q, k, v, is_causal=is_causal, feature_map="relu", chunk_size=4)
    # relu can leave a query with zero similarity to every key: the output is then 0, not NaN.
    np.testing.assert_allclose(
        numpy(out), reference(q, k, v, causal=is_causal, feature=lambda x: np.maximum(x, 0.0)), atol=1e-5
    )
    square = lambda x: keras.ops.square(x) + 0.1  # noqa: E731
    out = linear.linear_attention(q, k, v, is_causal=is_causal, feature_map=square, chunk_size=4)
    np.testing.assert_allclose(
        numpy(out), reference(q, k, v, causal=is_causal, feature=lambda x: x**2 + 0.1), atol=1e-5
    )


def test_feature_map_that_changes_the_dimension():
    q, k, v = random_qkv(length=5, value_dim=3)
    both_signs = lambda x: keras.ops.concatenate([keras.ops.relu(x), keras.ops.relu(-x)], axis=-1)  # noqa: E731
    numpy_both = lambda x: np.concatenate([np.maximum(x, 0), np.maximum(-x, 0)], -1)  # noqa: E731
    out, (state, normaliser) = linear.causal_linear_attention(
        q, k, v, feature_map=both_signs, chunk_size=2, return_state=True
    )
    np.testing.assert_allclose(numpy(out), reference(q, k, v, causal=True, feature=numpy_both), atol=1e-5)
    assert tuple(state.shape) == (2, 3, 8, 3) and tuple(normaliser.shape) == (2, 3, 8)


def test_unknown_feature_map_lists_known_ones():
    q, k, v = random_qkv(length=3)
    with pytest.raises(ValueError, match="Unknown linear-attention feature map 'elu_plus_on'.*elu_plus_one, relu"):
        linear.linear_attention(q, k, v, feature_map="elu_plus_on")
    with pytest.raises(TypeError):
        linear.get_feature_map(3)
    assert linear.get_feature_map("elu_plus_one") is linear.elu_plus_one
    assert {"elu_plus_one", "relu"} <= set(linear.feature_map_names())


def test_eps_is_added_to_the_denominator_only():
    """One key, one query: output = v · s / (s + eps) with s = φ(q)·φ(k)
    (fast-transformers: Z = 1 / (φ(Q)·Σφ(K) + eps), V' = (φ(Q)ᵀS) · Z)."""
    q = np.full((1, 1, 1, 1), -14.0, "float32")  # φ(q) = e^-14 ≈ 8e-7: the eps term matters
    k = np.zeros((1, 1, 1, 1), "float32")  # φ(k) = 1
    v = np.full((1, 1, 1, 1), 2.0, "float32")
    out = float(numpy(linear.linear_attention(q, k, v, eps=1e-6))[0, 0, 0, 0])
    s = np.exp(-14.0)
    np.testing.assert_allclose(out, 2.0 * s / (s + 1e-6), rtol=1e-4)  # ≈ 0.91
    # Without eps in the denominator (or with eps next to the numerator too) the output would be ≈ 2.


def test_dropout_while_training_is_rejected():
    q, k, v = random_qkv(length=3)
    with pytest.raises(ValueError, match="no attention probabilities to drop"):
        linear.linear_attention(q, k, v, dropout_rate=0.1, training=True)
    out = linear.linear_attention(q, k, v, dropout_rate=0.1, training=False)  # inference: no dropout anyway
    np.testing.assert_allclose(numpy(out), reference(q, k, v), atol=1e-5)


def test_bfloat16_inputs_accumulate_in_float32():
    q, k, v = random_qkv(length=40, dim=8)
    bf16 = [keras.ops.cast(t, "bfloat16") for t in (q, k, v)]
    expected = reference(*(numpy(keras.ops.cast(t, "float32")) for t in bf16), causal=True)
    out = linear.linear_attention(*bf16, is_causal=True, chunk_size=16)
    assert keras.backend.standardize_dtype(out.dtype) == "bfloat16"
    np.testing.assert_allclose(numpy(keras.ops.cast(out, "float32")), expected, atol=2e-2, rtol=1e-2)
    state = linear_decoding.linear_attention_initial_state(2, 3, 8, 8)
    _, state = linear_decoding.linear_attention_step(bf16[0][:, :1], bf16[1][:, :1], bf16[2][:, :1], state)
    assert keras.backend.standardize_dtype(state[0].dtype) == "float32"


def test_compiled():
    q, k, v = random_qkv(length=10)
    padding = np.array([[1] * 10, [1] * 7 + [0] * 3], bool)[:, None, None, :]

    def attend(query, key, value, mask):
        causal = linear.linear_attention(query, key, value, attention_mask=mask, is_causal=True, chunk_size=4)
        state = linear_decoding.linear_attention_initial_state(2, 3, 4, 4)
        step, _ = linear_decoding.linear_attention_step(query[:, :1], key[:, :1], value[:, :1], state)
        return causal, step

    causal, step = backend_support.compile_inference(attend, [])(q, k, v, padding)
    np.testing.assert_allclose(
        numpy(causal), reference(q, k, v, causal=True, key_padding=padding[:, 0, 0]), atol=1e-5
    )
    np.testing.assert_allclose(numpy(step)[:, 0], numpy(causal)[:, 0], atol=1e-5)


class _SelfAttention(keras.layers.Layer):
    def call(self, x, mask):
        heads = keras.ops.reshape(x, (keras.ops.shape(x)[0], keras.ops.shape(x)[1], 2, 3))
        mask = keras.ops.expand_dims(keras.ops.expand_dims(keras.ops.cast(mask, "bool"), 1), 1)
        out = linear.linear_attention(heads, heads, heads, attention_mask=mask, is_causal=True, chunk_size=4)
        return keras.ops.reshape(out, keras.ops.shape(x))


def test_functional_model_with_unknown_length():
    """A functional model whose sequence length is None when traced symbolically."""
    x = keras.Input((None, 6))
    mask = keras.Input((None,), dtype="int32")
    model = keras.Model([x, mask], _SelfAttention()(x, mask))
    data = np.random.default_rng(0).standard_normal((2, 7, 6)).astype("float32")
    padding = np.array([[1] * 7, [1] * 5 + [0] * 2], "int32")
    heads = data.reshape(2, 7, 2, 3)
    expected = reference(heads, heads, heads, causal=True, key_padding=padding.astype(bool)).reshape(2, 7, 6)
    np.testing.assert_allclose(numpy(model([data, padding])), expected, atol=1e-5)
    np.testing.assert_allclose(model.predict([data, padding], verbose=0), expected, atol=1e-5)


def test_causal_gradients_match_quadratic_form():
    ops = keras.ops

    def quadratic(query, key, value):
        phi_q, phi_k = linear.elu_plus_one(query), linear.elu_plus_one(key)
        similarity = ops.einsum("btnd,bsnd->bnts", phi_q, phi_k) * ops.tril(ops.ones((7, 7)))
        numerator = ops.einsum("bnts,bsnm->btnm", similarity, value)
        denominator = ops.transpose(ops.sum(similarity, -1), (0, 2, 1))
        return numerator / (ops.expand_dims(denominator, -1) + EPS)

    chunked = lambda q, k, v: linear.linear_attention(q, k, v, is_causal=True, chunk_size=3)  # noqa: E731
    inputs = random_qkv(length=7)
    for got, expected in zip(gradients(chunked, inputs), gradients(quadratic, inputs)):
        np.testing.assert_allclose(numpy(got), numpy(expected), atol=1e-4, rtol=1e-4)


def test_causal_long_sequence_without_a_length_squared_matrix():
    """L = 2^17: an L×L float32 matrix would be 64 GiB; the chunked form needs
    O(L·chunk) memory (tens of MB)."""
    length = 2**17
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, length, 1, 2)).astype("float32") for _ in range(3))
    out = numpy(linear.linear_attention(q, k, v, is_causal=True, chunk_size=64))
    assert out.shape == (1, length, 1, 2) and np.isfinite(out).all()
    # Spot-check the last position against the closed form over all keys.
    phi_q, phi_k = elu_plus_one(q[0, -1, 0].astype(np.float64)), elu_plus_one(k[0, :, 0].astype(np.float64))
    weights = phi_k @ phi_q
    np.testing.assert_allclose(out[0, -1, 0], weights @ v[0, :, 0] / (weights.sum() + EPS), atol=1e-4)
