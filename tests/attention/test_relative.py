"""Relative position attention (Shaw et al., 2018) and the Music Transformer
skew (Huang et al., 2019) against the papers' formulas in numpy:

    a^K_ij = w^K[clip(j − i, −k, k) + k]              (built as an explicit L×L×d tensor)
    e_ij   = (q_i · k_j + q_i · a^K_ij) / √d,  α = softmax_j(e_ij + M)
    out_i  = Σ_j α_ij (v_j + a^V_ij)
    S_rel[i, j] = q_i · E_r[j − i + L − 1]            (j ≤ i, an explicit loop)
"""

import keras
import numpy as np
import pytest

from attention_zoo_keras import backend_support
from attention_zoo_keras.attention import relative
from attention_zoo_keras.attention.registry import get_mechanism
from attention_zoo_keras.attention.registry import mechanism_names
from tests.support.attention_gradients import gradients

ATOL = 1e-5


def numpy(x):
    return keras.ops.convert_to_numpy(x)


def reference(query, key, value, key_table, value_table=None, mask=None, causal=False, query_offset=None):
    """numpy float64, the naive O(L²·d) formulation of Shaw et al.

    Tables are `(2k + 1, H)` (shared) or `(N, 2k + 1, H)` (per head); `mask`
    is boolean, broadcastable to `(B, N, T, S)`.
    """
    query, key, value = (np.asarray(t, np.float64) for t in (query, key, value))
    batch, query_length, num_heads, head_dim = query.shape
    key_length = key.shape[1]
    offset = key_length - query_length if query_offset is None else query_offset
    k = (key_table.shape[-2] - 1) // 2
    distance = np.arange(key_length)[None, :] - (np.arange(query_length)[:, None] + offset)  # j − i
    rows = np.clip(distance, -k, k) + k

    def embeddings(table):  # a_ij: (N, T, S, H), the L×L×d tensor
        table = np.asarray(table, np.float64)
        table = np.broadcast_to(table, (num_heads,) + table.shape[-2:])
        return table[:, rows, :]

    a_key = embeddings(key_table)
    logits = np.einsum("btnh,bsnh->bnts", query, key) + np.einsum("btnh,ntsh->bnts", query, a_key)
    logits /= np.sqrt(head_dim)
    allowed = np.ones(logits.shape, bool)
    if mask is not None:
        allowed &= np.broadcast_to(mask, logits.shape)
    if causal:
        allowed &= distance <= 0
    logits = np.where(allowed, logits, -np.inf)
    logits -= logits.max(-1, keepdims=True)
    weights = np.exp(logits)
    weights /= weights.sum(-1, keepdims=True)
    out = np.einsum("bnts,bsnh->btnh", weights, value)
    if value_table is not None:
        out += np.einsum("bnts,ntsh->btnh", weights, embeddings(value_table))
    return out


def reference_skew(query, relative_embeddings):
    """S_rel[b, n, i, j] = q_i · E_r[j − i + L − 1] for j ≤ i (E_r: its last L rows), else 0."""
    query = np.asarray(query, np.float64)
    batch, length, num_heads, _ = query.shape
    table = np.asarray(relative_embeddings, np.float64)
    table = np.broadcast_to(table, (num_heads,) + table.shape[-2:])[:, -length:, :]
    out = np.zeros((batch, num_heads, length, length))
    for i in range(length):
        for j in range(i + 1):
            out[:, :, i, j] = np.einsum("bnh,nh->bn", query[:, i], table[:, j - i + length - 1])
    return out


def random_inputs(batch=2, length=7, heads=3, dim=4, key_length=None, max_distance=2, per_head=False, seed=0):
    rng = np.random.default_rng(seed)
    key_length = length if key_length is None else key_length
    table_shape = ((heads,) if per_head else ()) + (2 * max_distance + 1, dim)
    return (
        rng.standard_normal((batch, length, heads, dim)).astype("float32"),
        rng.standard_normal((batch, key_length, heads, dim)).astype("float32"),
        rng.standard_normal((batch, key_length, heads, dim)).astype("float32"),
        rng.standard_normal(table_shape).astype("float32"),
        rng.standard_normal(table_shape).astype("float32"),
    )


# --- indices and the skew -------------------------------------------------


def test_registered_as_relative():
    assert get_mechanism("relative") is relative.relative_attention
    assert "relative" in mechanism_names()


def test_relative_position_indices_clip_the_distance():
    got = numpy(relative.relative_position_indices(4, 6, 2))  # offset 2: query i sits at i + 2
    distance = np.arange(6)[None, :] - (np.arange(4)[:, None] + 2)
    np.testing.assert_array_equal(got, np.clip(distance, -2, 2) + 2)
    assert got.min() == 0 and got.max() == 4


@pytest.mark.parametrize("per_head", [False, True])
@pytest.mark.parametrize("rows", [6, 9])  # exactly L distances, or a longer (max_length) table
def test_skew_equals_explicit_relative_logits(per_head, rows):
    rng = np.random.default_rng(1)
    query = rng.standard_normal((2, 6, 3, 4)).astype("float32")
    table = rng.standard_normal(((3,) if per_head else ()) + (rows, 4)).astype("float32")
    got = numpy(relative.skewed_relative_logits(query, table))
    assert got.shape == (2, 3, 6, 6)
    np.testing.assert_allclose(got, reference_skew(query, table), atol=ATOL)
    assert not got[..., np.triu_indices(6, 1)[0], np.triu_indices(6, 1)[1]].any()  # the future is 0


def test_skew_equals_shaw_relative_logits_on_the_causal_part():
    """E_r gathered from a clipped Shaw table: the skew gives q_i · a^K_ij for j ≤ i."""
    query, _, _, table, _ = random_inputs(length=8, max_distance=3, per_head=True)
    k = 3
    rows = np.clip(np.arange(8) - 7, -k, k) + k  # E_r[r] = w[clip(r − (L − 1), −k, k) + k]
    got = numpy(relative.skewed_relative_logits(query, table[:, rows]))
    distance = np.arange(8)[None, :] - np.arange(8)[:, None]
    a_key = table.astype(np.float64)[:, np.clip(distance, -k, k) + k]  # (N, L, L, H)
    naive = np.einsum("btnh,ntsh->bnts", query.astype(np.float64), a_key)
    causal = distance <= 0
    np.testing.assert_allclose(got[..., causal], naive[..., causal], atol=ATOL)


def test_skew_rejects_a_table_shorter_than_the_sequence():
    query = np.zeros((1, 5, 2, 4), "float32")
    with pytest.raises(ValueError, match="at least 5"):
        relative.skewed_relative_logits(query, np.zeros((4, 4), "float32"))


# --- relative attention against the naive formulation ---------------------


@pytest.mark.parametrize("max_distance", [0, 1, 2, 3, 10])
@pytest.mark.parametrize("per_head", [False, True])
def test_key_term_with_clipping(max_distance, per_head):
    q, k, v, wk, _ = random_inputs(max_distance=max_distance, per_head=per_head)
    out = relative.relative_attention(q, k, v, relative_key_embeddings=wk)
    assert tuple(out.shape) == q.shape
    np.testing.assert_allclose(numpy(out), reference(q, k, v, wk), atol=ATOL)


@pytest.mark.parametrize("max_distance", [0, 1, 2, 3, 10])
@pytest.mark.parametrize("per_head", [False, True])
@pytest.mark.parametrize("is_causal", [False, True])
def test_value_term(max_distance, per_head, is_causal):
    q, k, v, wk, wv = random_inputs(max_distance=max_distance, per_head=per_head)
    out = relative.relative_attention(
        q, k, v, relative_key_embeddings=wk, relative_value_embeddings=wv, is_causal=is_causal
    )
    np.testing.assert_allclose(numpy(out), reference(q, k, v, wk, wv, causal=is_causal), atol=ATOL)


def test_shared_and_per_head_tables_mix():
    q, k, v, wk, _ = random_inputs(per_head=False)
    wv = random_inputs(per_head=True, seed=3)[4]
    out = relative.relative_attention(q, k, v, relative_key_embeddings=wk, relative_value_embeddings=wv)
    np.testing.assert_allclose(numpy(out), reference(q, k, v, wk, wv), atol=ATOL)


def test_per_head_table_equal_to_shared_gives_the_same_output():
    q, k, v, wk, wv = random_inputs()
    shared = relative.relative_attention(q, k, v, relative_key_embeddings=wk, relative_value_embeddings=wv)
    tiled = relative.relative_attention(
        q, k, v, relative_key_embeddings=np.stack([wk] * 3), relative_value_embeddings=np.stack([wv] * 3)
    )
    np.testing.assert_allclose(numpy(tiled), numpy(shared), atol=ATOL)


@pytest.mark.parametrize("is_causal", [False, True])
def test_padding_mask(is_causal):
    q, k, v, wk, wv = random_inputs()
    mask = np.array([[1, 1, 1, 1, 0, 0, 0], [1] * 7], bool)[:, None, None, :]
    out = numpy(
        relative.relative_attention(
            q, k, v, attention_mask=mask, is_causal=is_causal, relative_key_embeddings=wk, relative_value_embeddings=wv
        )
    )
    np.testing.assert_allclose(out, reference(q, k, v, wk, wv, mask=mask, causal=is_causal), atol=ATOL)
    k2, v2 = k.copy(), v.copy()
    k2[0, 4:], v2[0, 4:] = 100.0, -100.0  # padded keys and values change nothing
    out2 = numpy(
        relative.relative_attention(
            q, k2, v2, attention_mask=mask, is_causal=is_causal, relative_key_embeddings=wk, relative_value_embeddings=wv
        )
    )
    np.testing.assert_allclose(out2[0], out[0], atol=ATOL)


@pytest.mark.parametrize("is_causal", [False, True])
def test_general_boolean_mask_per_head_and_query(is_causal):
    q, k, v, wk, wv = random_inputs(per_head=True)
    mask = np.random.default_rng(5).random((2, 3, 7, 7)) < 0.5
    mask[..., 0] = True  # every query keeps a key
    out = relative.relative_attention(
        q, k, v, attention_mask=mask, is_causal=is_causal, relative_key_embeddings=wk, relative_value_embeddings=wv
    )
    np.testing.assert_allclose(
        numpy(out), reference(q, k, v, wk, wv, mask=mask, causal=is_causal), atol=ATOL
    )


def test_causal_self_attention_uses_the_skew(monkeypatch):
    calls = []
    skew = relative.skewed_relative_logits

    def spy(*args):
        calls.append(args)
        return skew(*args)

    monkeypatch.setattr(relative, "skewed_relative_logits", spy)
    q, k, v, wk, wv = random_inputs(max_distance=3)
    out = relative.relative_attention(q, k, v, relative_key_embeddings=wk, is_causal=True)
    assert len(calls) == 1
    np.testing.assert_allclose(numpy(out), reference(q, k, v, wk, causal=True), atol=ATOL)
    relative.relative_attention(q, k, v, relative_key_embeddings=wk)  # non-causal: the gather
    assert len(calls) == 1


@pytest.mark.parametrize("is_causal", [False, True])
def test_cross_lengths_align_the_last_query_with_the_last_key(is_causal):
    q, k, v, wk, wv = random_inputs(length=3, key_length=8, max_distance=2)
    out = relative.relative_attention(
        q, k, v, relative_key_embeddings=wk, relative_value_embeddings=wv, is_causal=is_causal
    )
    np.testing.assert_allclose(numpy(out), reference(q, k, v, wk, wv, causal=is_causal), atol=ATOL)


def test_query_offset_for_decoding_into_a_cache():
    """One new token at position 4 of an 8-slot cache sees keys 0…4 at distances −4…0."""
    q, k, v, wk, wv = random_inputs(length=1, key_length=8, max_distance=2)
    out = relative.relative_attention(
        q, k, v, relative_key_embeddings=wk, relative_value_embeddings=wv, is_causal=True, query_offset=4
    )
    expected = reference(q, k, v, wk, wv, causal=True, query_offset=4)
    np.testing.assert_allclose(numpy(out), expected, atol=ATOL)
    full_q = random_inputs(length=8, max_distance=2)[0]
    full_q[:, 4] = q[:, 0]
    prefix = reference(full_q[:, :5], k[:, :5], v[:, :5], wk, wv, causal=True)
    np.testing.assert_allclose(numpy(out)[:, 0], prefix[:, 4], atol=ATOL)


def test_query_offset_as_a_traced_tensor_in_a_compiled_function():
    """A cache write position known only at run time (the whole table is used)."""
    q, k, v, wk, wv = random_inputs(length=2, key_length=8, max_distance=2, per_head=True)

    def attend(query, key, value, offset):
        return relative.relative_attention(
            query, key, value, relative_key_embeddings=wk, relative_value_embeddings=wv,
            is_causal=True, query_offset=offset,
        )

    compiled = backend_support.compile_inference(attend, [])
    for offset in (0, 3, 6):
        out = compiled(q, k, v, np.array(offset, "int32"))
        expected = reference(q, k, v, wk, wv, causal=True, query_offset=offset)
        np.testing.assert_allclose(numpy(out), expected, atol=ATOL)


@pytest.mark.parametrize("seed", range(25))
def test_random_shapes_masks_and_distances(seed):
    """Property check over drawn configurations (hypothesis is not a test
    dependency of this project; the draws are seeded, so failures replay)."""
    rng = np.random.default_rng(1000 + seed)
    batch, length, extra_keys, heads = (int(rng.integers(low, high)) for low, high in ((1, 3), (1, 7), (0, 4), (1, 4)))
    max_distance = int(rng.integers(0, 8))
    per_head, with_values, is_causal = (bool(b) for b in rng.integers(0, 2, 3))
    mask_kind = ["none", "padding", "general"][rng.integers(3)]
    q, k, v, wk, wv = random_inputs(
        batch, length, heads, 3, length + extra_keys, max_distance, per_head, seed
    )
    rng = np.random.default_rng(seed)
    key_length = length + extra_keys
    mask = None
    if mask_kind == "padding":
        mask = (rng.random((batch, 1, 1, key_length)) < 0.7) | (np.arange(key_length) == 0)
    elif mask_kind == "general":
        mask = (rng.random((batch, heads, length, key_length)) < 0.5) | (np.arange(key_length) == 0)
    wv = wv if with_values else None
    out = relative.relative_attention(
        q, k, v, attention_mask=mask, is_causal=is_causal, relative_key_embeddings=wk, relative_value_embeddings=wv
    )
    np.testing.assert_allclose(numpy(out), reference(q, k, v, wk, wv, mask=mask, causal=is_causal), atol=ATOL)


# --- weights, errors, dropout ---------------------------------------------


def test_max_distance_is_inferred_and_checked():
    q, k, v, wk, _ = random_inputs(max_distance=2)
    out = relative.relative_attention(q, k, v, relative_key_embeddings=wk, max_distance=2)
    np.testing.assert_allclose(numpy(out), reference(q, k, v, wk), atol=ATOL)
    with pytest.raises(ValueError, match="max_distance=3"):
        relative.relative_attention(q, k, v, relative_key_embeddings=wk, max_distance=3)
    with pytest.raises(ValueError, match="odd"):
        relative.relative_attention(q, k, v, relative_key_embeddings=wk[:4])
    with pytest.raises(ValueError, match="relative_key_embeddings"):
        relative.relative_attention(q, k, v)
    with pytest.raises(ValueError, match="heads"):
        relative.relative_attention(q, k, v, relative_key_embeddings=np.stack([wk] * 2))
    with pytest.raises(ValueError, match="head_dim"):
        relative.relative_attention(q, k, v, relative_key_embeddings=wk[:, :3])


def test_weight_specs_for_a_layer():
    specs = relative.relative_attention_weights(num_heads=3, head_dim=4, max_distance=2, per_head=True)
    assert {name: shape for name, (shape, _) in specs.items()} == {
        "relative_key_embeddings": (3, 5, 4),
        "relative_value_embeddings": (3, 5, 4),
    }
    shared = relative.relative_attention_weights(3, 4, 2, value_embeddings=False)
    assert {name: shape for name, (shape, _) in shared.items()} == {"relative_key_embeddings": (5, 4)}
    tables = {name: numpy(init(shape)) for name, (shape, init) in specs.items()}
    q, k, v, _, _ = random_inputs()
    out = relative.relative_attention(q, k, v, **tables)
    np.testing.assert_allclose(
        numpy(out), reference(q, k, v, tables["relative_key_embeddings"], tables["relative_value_embeddings"]),
        atol=ATOL,
    )


@pytest.mark.parametrize("is_causal", [False, True])
def test_dropout_path_at_negligible_rate_equals_inference(is_causal):
    q, k, v, wk, wv = random_inputs()
    kwargs = dict(relative_key_embeddings=wk, relative_value_embeddings=wv, is_causal=is_causal)
    plain = numpy(relative.relative_attention(q, k, v, **kwargs))
    dropped = relative.relative_attention(
        q, k, v, dropout_rate=1e-9, training=True, seed_generator=keras.random.SeedGenerator(0), **kwargs
    )
    np.testing.assert_allclose(numpy(dropped), plain, atol=ATOL)


def test_dropout_only_while_training():
    q, k, v, wk, wv = random_inputs()
    kwargs = dict(relative_key_embeddings=wk, relative_value_embeddings=wv, dropout_rate=0.5)
    expected = reference(q, k, v, wk, wv)
    np.testing.assert_allclose(numpy(relative.relative_attention(q, k, v, training=False, **kwargs)), expected, atol=ATOL)
    dropped = relative.relative_attention(q, k, v, training=True, seed_generator=keras.random.SeedGenerator(0), **kwargs)
    assert not np.allclose(numpy(dropped), expected, atol=1e-3)


def test_dropout_is_inverted_and_applies_to_the_value_term():
    """With zero values and a constant all-ones value table, each output is Σ_j
    of the dropped probabilities: mean 1 only if a^V sees the dropped, rescaled α."""
    rng = np.random.default_rng(0)
    q, k = (rng.standard_normal((4, 64, 8, 4)).astype("float32") for _ in range(2))
    v = np.zeros((4, 64, 8, 4), "float32")
    wk = rng.standard_normal((5, 4)).astype("float32")
    out = numpy(
        relative.relative_attention(
            q, k, v, relative_key_embeddings=wk, relative_value_embeddings=np.ones((5, 4), "float32"),
            dropout_rate=0.25, training=True, seed_generator=keras.random.SeedGenerator(0),
        )
    )
    assert abs(out.mean() - 1.0) < 0.01
    assert out.std() > 0.05


# --- compiled, functional, gradients, memory ------------------------------


@pytest.mark.parametrize("is_causal", [False, True])
def test_compiled(is_causal):
    q, k, v, wk, wv = random_inputs(per_head=True)
    mask = np.array([[1] * 7, [1] * 5 + [0] * 2], bool)[:, None, None, :]

    def attend(query, key, value, key_table, value_table, attention_mask):
        return relative.relative_attention(
            query, key, value, attention_mask=attention_mask, is_causal=is_causal,
            relative_key_embeddings=key_table, relative_value_embeddings=value_table,
        )

    out = backend_support.compile_inference(attend, [])(q, k, v, wk, wv, mask)
    np.testing.assert_allclose(numpy(out), reference(q, k, v, wk, wv, mask=mask, causal=is_causal), atol=ATOL)


class _RelativeSelfAttention(keras.layers.Layer):
    def __init__(self, tables, **kwargs):
        super().__init__(**kwargs)
        self.tables = tables

    def call(self, x):
        heads = keras.ops.reshape(x, (keras.ops.shape(x)[0], keras.ops.shape(x)[1], 2, 3))
        out = relative.relative_attention(heads, heads, heads, is_causal=True, **self.tables)
        return keras.ops.reshape(out, keras.ops.shape(x))


def test_functional_model_with_unknown_length():
    rng = np.random.default_rng(0)
    tables = {
        "relative_key_embeddings": rng.standard_normal((2, 7, 3)).astype("float32"),
        "relative_value_embeddings": rng.standard_normal((7, 3)).astype("float32"),
    }
    x = keras.Input((None, 6))
    model = keras.Model(x, _RelativeSelfAttention(tables)(x))
    data = rng.standard_normal((2, 9, 6)).astype("float32")
    heads = data.reshape(2, 9, 2, 3)
    expected = reference(heads, heads, heads, *tables.values(), causal=True).reshape(2, 9, 6)
    np.testing.assert_allclose(numpy(model(data)), expected, atol=ATOL)
    np.testing.assert_allclose(model.predict(data, verbose=0), expected, atol=ATOL)


def _naive_in_keras_ops(query, key, value, key_table, value_table, is_causal, max_distance):
    """Shaw et al. with the explicit L×L×d tensors a^K, a^V, in keras.ops (for autodiff)."""
    ops = keras.ops
    length = query.shape[1]
    rows = relative.relative_position_indices(length, length, max_distance)  # (L, L)
    a_key, a_value = ops.take(key_table, rows, axis=-2), ops.take(value_table, rows, axis=-2)  # (N, L, L, H)
    logits = ops.einsum("btnh,bsnh->bnts", query, key) + ops.einsum("btnh,ntsh->bnts", query, a_key)
    logits = logits / np.sqrt(query.shape[-1]).astype("float32")
    if is_causal:
        logits = ops.where(np.tril(np.ones((length, length), bool)), logits, -1e9)
    weights = ops.softmax(logits, axis=-1)
    return ops.einsum("bnts,bsnh->btnh", weights, value) + ops.einsum("bnts,ntsh->btnh", weights, a_value)


@pytest.mark.parametrize("is_causal", [False, True])
def test_gradients_match_the_naive_formulation(is_causal):
    inputs = random_inputs(length=6, max_distance=2, per_head=True)

    def efficient(q, k, v, wk, wv):
        return relative.relative_attention(
            q, k, v, relative_key_embeddings=wk, relative_value_embeddings=wv, is_causal=is_causal
        )

    def naive(q, k, v, wk, wv):
        return _naive_in_keras_ops(q, k, v, wk, wv, is_causal, 2)

    for got, expected in zip(gradients(efficient, inputs), gradients(naive, inputs)):
        np.testing.assert_allclose(numpy(got), numpy(expected), atol=1e-4, rtol=1e-4)


def test_causal_long_sequence_without_a_length_squared_by_dim_tensor():
    """L = 4096, d = 512: an L×L×d float32 a^K (or one-hot L×L×(2k+1) with
    k = L − 1) would be 32 GiB; the skew and the bucketed value term need the
    L×L logits (64 MiB) and O(L·d) for the tables."""
    length, dim = 4096, 512
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, length, 1, dim)).astype("float32") for _ in range(3))
    k_max = length - 1  # Music Transformer: every causal distance has its own embedding
    wk, wv = (0.05 * rng.standard_normal((2 * k_max + 1, dim)).astype("float32") for _ in range(2))
    out = numpy(
        relative.relative_attention(
            q, k, v, relative_key_embeddings=wk, relative_value_embeddings=wv, is_causal=True
        )
    )
    assert out.shape == (1, length, 1, dim) and np.isfinite(out).all()
    for i in (0, 1000, length - 1):  # spot-check rows against the formula
        expected = reference(q[:, i : i + 1], k[:, : i + 1], v[:, : i + 1], wk, wv, causal=True)
        np.testing.assert_allclose(out[:, i : i + 1], expected, atol=1e-4)
