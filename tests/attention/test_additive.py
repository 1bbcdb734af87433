"""Additive attention (Bahdanau et al., 2015) against the paper's formula in
numpy, one (query, key) pair at a time:

    e_ij = vᵀ tanh(W_q q_i + W_k k_j),  α = softmax_j(e_ij + M),  out_i = Σ_j α_ij v_j
"""

import keras
import numpy as np
import pytest

from attention_zoo_keras import backend_support
from attention_zoo_keras.attention import additive
from attention_zoo_keras.attention.registry import get_mechanism
from attention_zoo_keras.attention.registry import mechanism_names

ATOL = 1e-5


def numpy(x):
    return keras.ops.convert_to_numpy(x)


def reference(query, key, value, query_kernel, key_kernel, score_vector, mask=None, causal=False):
    """numpy float64; kernels `(N, H, U)`, score vector `(N, U)`, mask broadcastable to `(B, N, T, S)`."""
    query, key, value, query_kernel, key_kernel, score_vector = (
        np.asarray(t, np.float64) for t in (query, key, value, query_kernel, key_kernel, score_vector)
    )
    batch, query_length, num_heads, _ = query.shape
    key_length = key.shape[1]
    scores = np.empty((batch, num_heads, query_length, key_length))
    for b in range(batch):
        for n in range(num_heads):
            for i in range(query_length):
                for j in range(key_length):
                    hidden = np.tanh(query[b, i, n] @ query_kernel[n] + key[b, j, n] @ key_kernel[n])
                    scores[b, n, i, j] = score_vector[n] @ hidden
    allowed = np.ones(scores.shape, bool)
    if mask is not None:
        allowed &= np.broadcast_to(mask, scores.shape)
    if causal:
        allowed &= np.arange(key_length)[None, :] <= np.arange(query_length)[:, None] + key_length - query_length
    scores = np.where(allowed, scores, -np.inf)
    scores -= scores.max(-1, keepdims=True)
    weights = np.exp(scores)
    weights /= weights.sum(-1, keepdims=True)
    return np.einsum("bnts,bsnh->btnh", weights, value)


def random_inputs(batch=2, length=5, heads=3, dim=4, units=6, key_length=None, value_dim=None, seed=0):
    rng = np.random.default_rng(seed)
    key_length = length if key_length is None else key_length
    value_dim = dim if value_dim is None else value_dim
    tensors = (
        rng.standard_normal((batch, length, heads, dim)),
        rng.standard_normal((batch, key_length, heads, dim)),
        rng.standard_normal((batch, key_length, heads, value_dim)),
        rng.standard_normal((heads, dim, units)) / np.sqrt(dim),
        rng.standard_normal((heads, dim, units)) / np.sqrt(dim),
        rng.standard_normal((heads, units)),
    )
    return tuple(t.astype("float32") for t in tensors)


def attend(q, k, v, wq, wk, s, **kwargs):
    return additive.additive_attention(q, k, v, query_kernel=wq, key_kernel=wk, score_vector=s, **kwargs)


def test_registered_as_additive():
    assert get_mechanism("additive") is additive.additive_attention
    assert "additive" in mechanism_names()


def test_matches_formula_without_mask():
    inputs = random_inputs()
    out = attend(*inputs)
    assert tuple(out.shape) == inputs[0].shape
    np.testing.assert_allclose(numpy(out), reference(*inputs), atol=ATOL)


def test_cross_attention_with_other_lengths_and_value_dim():
    inputs = random_inputs(length=3, key_length=8, value_dim=7)
    out = attend(*inputs)
    assert tuple(out.shape) == (2, 3, 3, 7)
    np.testing.assert_allclose(numpy(out), reference(*inputs), atol=ATOL)


@pytest.mark.parametrize("is_causal", [False, True])
def test_padding_mask(is_causal):
    q, k, v, wq, wk, s = random_inputs()
    mask = np.array([[1, 1, 1, 0, 0], [1] * 5], bool)[:, None, None, :]
    out = numpy(attend(q, k, v, wq, wk, s, attention_mask=mask, is_causal=is_causal))
    np.testing.assert_allclose(out, reference(q, k, v, wq, wk, s, mask=mask, causal=is_causal), atol=ATOL)
    k2, v2 = k.copy(), v.copy()
    k2[0, 3:], v2[0, 3:] = 100.0, -100.0  # padded keys and values change nothing
    out2 = numpy(attend(q, k2, v2, wq, wk, s, attention_mask=mask, is_causal=is_causal))
    np.testing.assert_allclose(out2[0], out[0], atol=ATOL)


def test_general_boolean_mask():
    inputs = random_inputs()
    mask = np.random.default_rng(3).random((2, 3, 5, 5)) < 0.5
    mask[..., 0] = True
    np.testing.assert_allclose(
        numpy(attend(*inputs, attention_mask=mask)), reference(*inputs, mask=mask), atol=ATOL
    )


@pytest.mark.parametrize("key_length", [5, 8])
def test_causal(key_length):
    inputs = random_inputs(key_length=key_length)
    np.testing.assert_allclose(
        numpy(attend(*inputs, is_causal=True)), reference(*inputs, causal=True), atol=ATOL
    )


def test_zero_score_vector_attends_uniformly():
    """The paper's initialisation (v = 0): every key gets the same weight."""
    q, k, v, wq, wk, s = random_inputs()
    out = attend(q, k, v, wq, wk, np.zeros_like(s))
    np.testing.assert_allclose(numpy(out), np.broadcast_to(v.mean(1, keepdims=True), q.shape), atol=ATOL)


def test_weight_specs_for_a_layer():
    specs = additive.additive_attention_weights(num_heads=3, head_dim=4, units=6)
    assert {name: shape for name, (shape, _) in specs.items()} == {
        "query_kernel": (3, 4, 6),
        "key_kernel": (3, 4, 6),
        "score_vector": (3, 6),
    }
    weights = {name: numpy(initializer(shape)) for name, (shape, initializer) in specs.items()}
    assert not weights["score_vector"].any()
    limit = np.sqrt(6 / (4 + 6))  # Glorot-uniform of each head's (head_dim, units) matrix
    shape, initializer = additive.additive_attention_weights(num_heads=8, head_dim=64, units=64)["query_kernel"]
    big = numpy(initializer(shape))
    assert np.abs(big).max() <= np.sqrt(6 / 128) and np.abs(big).max() > 0.95 * np.sqrt(6 / 128)
    assert np.abs(weights["query_kernel"]).max() <= limit
    q, k, v = random_inputs()[:3]
    np.testing.assert_allclose(numpy(additive.additive_attention(q, k, v, **weights)), reference(q, k, v, *weights.values()), atol=ATOL)


def test_missing_or_inconsistent_weights():
    q, k, v, wq, wk, s = random_inputs()
    with pytest.raises(ValueError, match="score_vector"):
        additive.additive_attention(q, k, v, query_kernel=wq, key_kernel=wk)
    with pytest.raises(ValueError, match="heads"):
        attend(q, k, v, wq[:2], wk, s)
    with pytest.raises(ValueError, match="units"):
        attend(q, k, v, wq, wk, s[:, :5])
    with pytest.raises(ValueError, match="head_dim"):
        attend(q, k, v, wq[:, :3], wk, s)


def test_dropout():
    inputs = random_inputs()
    expected = reference(*inputs)
    np.testing.assert_allclose(numpy(attend(*inputs, dropout_rate=0.5, training=False)), expected, atol=ATOL)
    negligible = attend(*inputs, dropout_rate=1e-9, training=True, seed_generator=keras.random.SeedGenerator(0))
    np.testing.assert_allclose(numpy(negligible), expected, atol=ATOL)
    dropped = attend(*inputs, dropout_rate=0.5, training=True, seed_generator=keras.random.SeedGenerator(0))
    assert not np.allclose(numpy(dropped), expected, atol=1e-3)


@pytest.mark.parametrize("is_causal", [False, True])
def test_compiled(is_causal):
    q, k, v, wq, wk, s = random_inputs()
    mask = np.array([[1] * 5, [1, 1, 1, 0, 0]], bool)[:, None, None, :]

    def function(*args):
        return attend(*args[:6], attention_mask=args[6], is_causal=is_causal)

    out = backend_support.compile_inference(function, [])(q, k, v, wq, wk, s, mask)
    np.testing.assert_allclose(
        numpy(out), reference(q, k, v, wq, wk, s, mask=mask, causal=is_causal), atol=ATOL
    )
