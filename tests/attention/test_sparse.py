"""Sparse Transformer attention (Child et al., 2019, §4.2–4.3).

The pattern masks are checked against small examples written out by hand
from the paper's definitions (the patterns its Fig. 3 draws), and against a
position-by-position implementation of the formulas; the blockwise
mechanism against dense softmax attention under those masks in numpy (a
query with an empty set outputs 0).
"""

import itertools

import keras
import numpy as np
import pytest

from attention_zoo_keras import backend_support
from attention_zoo_keras.attention import sparse
from attention_zoo_keras.attention.registry import get_mechanism
from tests.support.attention_gradients import dense_attention
from tests.support.attention_gradients import gradients


def numpy(x):
    return keras.ops.convert_to_numpy(x)


def reference_attention(query, key, value, mask):
    """numpy float64 softmax attention; rows with no visible key are 0."""
    query, key, value = (np.asarray(t, np.float64) for t in (query, key, value))
    logits = np.einsum("btnh,bsnh->bnts", query, key) / np.sqrt(query.shape[-1])
    logits = np.where(mask, logits, -np.inf)
    with np.errstate(invalid="ignore"):
        logits -= logits.max(-1, keepdims=True)
        weights = np.exp(logits)
        weights /= weights.sum(-1, keepdims=True)
    return np.einsum("bnts,bsnh->btnh", np.nan_to_num(weights), value)


def random_qkv(length, batch=2, heads=3, dim=4, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((batch, length, heads, dim)).astype("float32") for _ in range(3)]


def pattern(rows):
    """Rows like "1..1" → a boolean matrix."""
    return np.array([[ch == "1" for ch in row] for row in rows])


def definition(length, kind, stride, c, combine, causal, num_heads=3):
    """The §4.2 sets, one (i, j) at a time."""
    first = np.zeros((length, length), bool)
    second = np.zeros((length, length), bool)
    for i, j in itertools.product(range(length), repeat=2):
        if kind == "strided":
            first[i, j] = (max(0, i - stride) <= j <= i) if causal else abs(i - j) <= stride
            second[i, j] = (i - j) % stride == 0
        else:
            first[i, j] = j // stride == i // stride
            second[i, j] = j % stride in range(stride - c, stride)
    if causal:
        lower = np.tril(np.ones((length, length), bool))
        first, second = first & lower, second & lower
    if combine == "merged":
        return first | second
    if combine == "a":
        return first
    if combine == "b":
        return second
    return np.stack([first if h % 2 == 0 else second for h in range(num_heads)])


# --- the masks ------------------------------------------------------------

STRIDED_3_A = ["1.......", "11......", "111.....", "1111....", ".1111...", "..1111..", "...1111.", "....1111"]
STRIDED_3_B = ["1.......", ".1......", "..1.....", "1..1....", ".1..1...", "..1..1..", "1..1..1.", ".1..1..1"]
STRIDED_3_MERGED = STRIDED_3_A[:6] + ["1..1111.", ".1..1111"]
FIXED_4_1_A = ["1.......", "11......", "111.....", "1111....", "....1...", "....11..", "....111.", "....1111"]
FIXED_4_1_B = ["........", "........", "........", "...1....", "...1....", "...1....", "...1....", "...1...1"]
FIXED_4_1_MERGED = ["1.......", "11......", "111.....", "1111....", "...11...", "...111..", "...1111.", "...11111"]
FIXED_4_2_MERGED = ["1.......", "11......", "111.....", "1111....", "..111...", "..1111..", "..11111.", "..111111"]


@pytest.mark.parametrize(
    "kind,stride,c,combine,expected",
    [
        ("strided", 3, 1, "a", STRIDED_3_A),
        ("strided", 3, 1, "b", STRIDED_3_B),
        ("strided", 3, 1, "merged", STRIDED_3_MERGED),
        ("fixed", 4, 1, "a", FIXED_4_1_A),
        ("fixed", 4, 1, "b", FIXED_4_1_B),
        ("fixed", 4, 1, "merged", FIXED_4_1_MERGED),
        ("fixed", 4, 2, "merged", FIXED_4_2_MERGED),
    ],
)
def test_mask_hand_written(kind, stride, c, combine, expected):
    got = numpy(sparse.sparse_mask(8, kind, stride=stride, c=c, combine=combine))
    np.testing.assert_array_equal(got, pattern(expected))


def test_mask_heads_alternate_and_non_causal_extension():
    heads = numpy(sparse.sparse_mask(8, "strided", stride=3, combine="heads", num_heads=4))
    assert heads.shape == (4, 8, 8)
    for h, expected in enumerate([STRIDED_3_A, STRIDED_3_B] * 2):
        np.testing.assert_array_equal(heads[h], pattern(expected))
    both_ways = numpy(sparse.sparse_mask(5, "strided", stride=2, is_causal=False))
    np.testing.assert_array_equal(both_ways, pattern(["111.1", "1111.", "11111", ".1111", "1.111"]))
    fixed = numpy(sparse.sparse_mask(6, "fixed", stride=3, c=1, is_causal=False))
    np.testing.assert_array_equal(fixed, pattern(["111..1", "111..1", "111..1", "..1111", "..1111", "..1111"]))


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("combine", sparse.COMBINES)
@pytest.mark.parametrize("kind,stride,c", [("strided", 4, 1), ("strided", 5, 1), ("fixed", 4, 1), ("fixed", 5, 2)])
def test_mask_matches_definition(kind, stride, c, combine, causal):
    got = numpy(sparse.sparse_mask(23, kind, stride, c, combine, causal, num_heads=3))
    np.testing.assert_array_equal(got, definition(23, kind, stride, c, combine, causal))


def test_unknown_pattern_and_bad_arguments():
    q = np.zeros((1, 4, 1, 2), "float32")
    with pytest.raises(ValueError, match="Unknown sparse attention pattern 'strided2'.*Did you mean: strided"):
        sparse.sparse_attention(q, q, q, pattern="strided2")
    with pytest.raises(ValueError, match="Unknown sparse attention pattern 'dilated'.*Known patterns: strided, fixed"):
        sparse.sparse_mask(4, "dilated")
    with pytest.raises(ValueError, match="Unknown way to combine.*'union'"):
        sparse.sparse_mask(4, "fixed", combine="union")
    with pytest.raises(ValueError, match="1 ≤ c ≤ stride"):
        sparse.sparse_mask(4, "fixed", stride=2, c=3)
    with pytest.raises(ValueError, match="stride"):
        sparse.sparse_mask(4, "strided", stride=0)
    with pytest.raises(ValueError, match="query and key lengths must be equal"):
        sparse.sparse_attention(q[:, :1], q, q)


def test_registered():
    assert get_mechanism("sparse") is sparse.sparse_attention


# --- attention --------------------------------------------------------------


def full_mask(mask):
    """(L, L) or per-head (N, L, L) → broadcastable to (B, N, L, L)."""
    return mask[None, None] if mask.ndim == 2 else mask[None]


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("combine", sparse.COMBINES)
@pytest.mark.parametrize(
    "kind,stride,c,length",
    [
        ("strided", 4, 1, 16),
        ("strided", 4, 1, 13),
        ("strided", 3, 1, 2),
        ("strided", 5, 1, 23),
        ("fixed", 4, 1, 16),
        ("fixed", 4, 2, 13),
        ("fixed", 3, 3, 10),
        ("fixed", 8, 2, 5),
    ],
)
def test_matches_dense_softmax(kind, stride, c, length, combine, causal):
    q, k, v = random_qkv(length)
    out = sparse.sparse_attention(q, k, v, is_causal=causal, pattern=kind, stride=stride, c=c, combine=combine)
    assert tuple(out.shape) == (2, length, 3, 4)
    mask = full_mask(definition(length, kind, stride, c, combine, causal))
    np.testing.assert_allclose(numpy(out), reference_attention(q, k, v, mask), atol=1e-5)


def test_empty_set_outputs_zero():
    """Fixed, second factor only: positions 0…2 precede the first summary cell."""
    q, k, v = random_qkv(8)
    out = numpy(sparse.sparse_attention(q, k, v, is_causal=True, pattern="fixed", stride=4, c=1, combine="b"))
    np.testing.assert_array_equal(out[:, :3], 0.0)
    np.testing.assert_allclose(out[:, 3:6], np.broadcast_to(v[:, 3:4], out[:, 3:6].shape), atol=1e-6)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("kind", sparse.PATTERNS)
def test_key_padding_and_general_masks(kind, causal):
    length = 14
    q, k, v = random_qkv(length, seed=1)
    pattern_mask = full_mask(definition(length, kind, 4, 2, "merged", causal))
    padding = (np.arange(length)[None, :] < np.array([[length], [10]]))[:, None, None, :]
    kwargs = dict(is_causal=causal, pattern=kind, stride=4, c=2)
    out = sparse.sparse_attention(q, k, v, attention_mask=padding, **kwargs)
    np.testing.assert_allclose(numpy(out), reference_attention(q, k, v, padding & pattern_mask), atol=1e-5)
    k2, v2 = k.copy(), v.copy()
    k2[1, 10:], v2[1, 10:] = 100.0, -100.0
    out2 = sparse.sparse_attention(q, k2, v2, attention_mask=padding, **kwargs)
    np.testing.assert_allclose(numpy(out2)[1, :10], numpy(out)[1, :10], atol=1e-5)
    general = np.random.default_rng(2).random((2, 3, length, length)) < 0.6
    out = sparse.sparse_attention(q, k, v, attention_mask=general, **kwargs)
    np.testing.assert_allclose(numpy(out), reference_attention(q, k, v, general & pattern_mask), atol=1e-5)


def test_compiled():
    q, k, v = random_qkv(11)
    padding = (np.arange(11)[None, :] < np.array([[11], [8]]))[:, None, None, :]

    def attend(query, key, value, mask):
        strided = sparse.sparse_attention(query, key, value, attention_mask=mask, is_causal=True, stride=3)
        fixed = sparse.sparse_attention(
            query, key, value, attention_mask=mask, is_causal=True, pattern="fixed", stride=4, c=2, combine="heads"
        )
        return strided, fixed

    strided, fixed = backend_support.compile_inference(attend, [])(q, k, v, padding)
    expected = reference_attention(q, k, v, padding & full_mask(definition(11, "strided", 3, 1, "merged", True)))
    np.testing.assert_allclose(numpy(strided), expected, atol=1e-5)
    expected = reference_attention(q, k, v, padding & full_mask(definition(11, "fixed", 4, 2, "heads", True)))
    np.testing.assert_allclose(numpy(fixed), expected, atol=1e-5)


class _SelfAttention(keras.layers.Layer):
    def call(self, x):
        heads = keras.ops.reshape(x, (keras.ops.shape(x)[0], keras.ops.shape(x)[1], 2, 3))
        out = sparse.sparse_attention(heads, heads, heads, is_causal=True, pattern="fixed", stride=3, c=1)
        return keras.ops.reshape(out, keras.ops.shape(x))


def test_functional_model_with_unknown_length():
    x = keras.Input((None, 6))
    model = keras.Model(x, _SelfAttention()(x))
    data = np.random.default_rng(0).standard_normal((2, 7, 6)).astype("float32")
    heads = data.reshape(2, 7, 2, 3)
    expected = reference_attention(heads, heads, heads, full_mask(definition(7, "fixed", 3, 1, "merged", True)))
    np.testing.assert_allclose(numpy(model(data)), expected.reshape(2, 7, 6), atol=1e-5)
    np.testing.assert_allclose(model.predict(data, verbose=0), expected.reshape(2, 7, 6), atol=1e-5)


@pytest.mark.parametrize("kind", sparse.PATTERNS)
def test_gradients_match_dense_softmax(kind):
    inputs = random_qkv(10, seed=3)
    mask = full_mask(definition(10, kind, 3, 1, "merged", True))
    blockwise = lambda q, k, v: sparse.sparse_attention(  # noqa: E731
        q, k, v, is_causal=True, pattern=kind, stride=3, c=1
    )
    dense = lambda q, k, v: dense_attention(q, k, v, mask)  # noqa: E731
    for got, expected in zip(gradients(blockwise, inputs), gradients(dense, inputs)):
        assert np.isfinite(numpy(got)).all()
        np.testing.assert_allclose(numpy(got), numpy(expected), atol=1e-4, rtol=1e-4)


def test_dropout():
    q, k, v = random_qkv(10)
    kwargs = dict(is_causal=True, stride=3)
    inference = numpy(sparse.sparse_attention(q, k, v, **kwargs))
    negligible = sparse.sparse_attention(
        q, k, v, dropout_rate=1e-9, training=True, seed_generator=keras.random.SeedGenerator(0), **kwargs
    )
    np.testing.assert_allclose(numpy(negligible), inference, atol=1e-5)
    dropped = sparse.sparse_attention(
        q, k, v, dropout_rate=0.5, training=True, seed_generator=keras.random.SeedGenerator(0), **kwargs
    )
    assert not np.allclose(numpy(dropped), inference, atol=1e-3)
    rng = np.random.default_rng(0)
    q, k = (rng.standard_normal((4, 64, 8, 4)).astype("float32") for _ in range(2))
    out = numpy(
        sparse.sparse_attention(
            q, k, np.ones_like(q), is_causal=True, pattern="fixed", stride=8, c=2, dropout_rate=0.25,
            training=True, seed_generator=keras.random.SeedGenerator(0),
        )
    )
    assert abs(out.mean() - 1.0) < 0.02 and out.std() > 0.05


def test_long_sequence_without_a_length_squared_matrix():
    """L = 2^15 at stride 128: an L×L float32 matrix would be 4 GiB; the
    blockwise form holds L × (2·128 + 256) logits per head (64 MiB)."""
    length, stride = 2**15, 128
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, length, 1, 2)).astype("float32") for _ in range(3))
    out = numpy(sparse.sparse_attention(q, k, v, is_causal=True, stride=stride))
    assert out.shape == (1, length, 1, 2) and np.isfinite(out).all()
    # The last position: the previous 128 positions and every 128th before them.
    i = length - 1
    keys = np.union1d(np.arange(i - stride, i + 1), np.arange(i % stride, i + 1, stride))
    logits = k[0, keys, 0] @ q[0, -1, 0] / np.sqrt(2)
    weights = np.exp(logits - logits.max())
    np.testing.assert_allclose(out[0, -1, 0], weights @ v[0, keys, 0] / weights.sum(), atol=1e-5)
