"""Reformer LSH attention against Hugging Face transformers'
`LSHSelfAttention` (the same random rotations, the same outputs and
buckets), against full shared-QK attention when the chunks cover the whole
sequence, and its errors.

transformers draws the rotations inside `_hash_vectors` with `torch.randn`;
with `config.hash_seed` set it first calls `torch.manual_seed(hash_seed)`.
The parity tests set `hash_seed` and draw the same tensor the same way
(`torch.manual_seed(seed); torch.randn(shape)`, transformers' layout
`(heads, head_dim, num_hashes, buckets/2)`), hand it to `lsh_attention`, and
check the buckets the module returns as well as its outputs — so a
different draw would show as a bucket mismatch, not as a vague numerical
difference.
"""

import keras
import numpy as np
import pytest

from attention_zoo_keras.attention.lsh import lsh_attention
from attention_zoo_keras.attention.lsh import lsh_buckets
from attention_zoo_keras.attention.lsh import lsh_rotations_shape
from attention_zoo_keras.attention.registry import get_mechanism
from attention_zoo_keras.attention.registry import mechanism_options

BATCH, LENGTH, HEADS, HEAD_DIM, HIDDEN = 2, 16, 2, 8, 16
HASH_SEED = 7


def _numpy(x):
    return np.asarray(keras.ops.convert_to_numpy(x))


def _transformers_case(num_buckets, is_decoder, padded, num_hashes=2, chunks_before=1, chunks_after=0, seed=0):
    """Runs transformers' `LSHSelfAttention` on random hidden states.
    Returns its projected shared QK and values `(B, L, N, D)`, the boolean
    key mask `(B, 1, 1, L)` or None, the rotations it drew, its output
    `(B, L, N, D)` (before any output projection) and its buckets less their
    round offsets `(B, N, n_h, L)`."""
    torch = pytest.importorskip("torch")
    reformer = pytest.importorskip("transformers.models.reformer.modeling_reformer")
    from transformers import ReformerConfig

    config = ReformerConfig(
        hidden_size=HIDDEN,
        num_attention_heads=HEADS,
        attention_head_size=HEAD_DIM,
        attn_layers=["lsh"],
        lsh_attn_chunk_length=4,
        num_hashes=num_hashes,
        num_buckets=num_buckets,
        lsh_num_chunks_before=chunks_before,
        lsh_num_chunks_after=chunks_after,
        is_decoder=is_decoder,
        hash_seed=HASH_SEED,
        lsh_attention_probs_dropout_prob=0.0,
        max_position_embeddings=64,
    )
    torch.manual_seed(seed)
    module = reformer.LSHSelfAttention(config).eval()
    hidden = torch.randn(BATCH, LENGTH, HIDDEN)
    mask = torch.ones(BATCH, LENGTH, dtype=torch.long)
    if padded:
        mask[1, 11:] = 0
    with torch.no_grad():
        result = module(hidden, attention_mask=mask if padded else None)
        torch.manual_seed(HASH_SEED)  # transformers' draw, reproduced
        rotations = torch.randn(lsh_rotations_shape(HEADS, HEAD_DIM, num_hashes, num_buckets))
        query_key = (hidden @ module.query_key.weight.T).reshape(BATCH, LENGTH, HEADS, HEAD_DIM)
        value = (hidden @ module.value.weight.T).reshape(BATCH, LENGTH, HEADS, HEAD_DIM)
    buckets_per_round = int(np.prod(num_buckets)) + (1 if padded else 0)  # + transformers' padding bucket
    offsets = np.arange(num_hashes)[None, None, :, None] * buckets_per_round
    return (
        query_key.numpy(),
        value.numpy(),
        mask.numpy().astype(bool)[:, None, None, :] if padded else None,
        rotations.numpy(),
        result.hidden_states.reshape(BATCH, LENGTH, HEADS, HEAD_DIM).numpy(),
        result.buckets.numpy() - offsets,
    )


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
@pytest.mark.parametrize("is_decoder", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("num_buckets", [4, [2, 2]], ids=["4_buckets", "factorised_2x2"])
def test_matches_transformers_lsh_self_attention(num_buckets, is_decoder, padded):
    query_key, value, mask, rotations, expected, expected_buckets = _transformers_case(num_buckets, is_decoder, padded)
    buckets = lsh_buckets(query_key, rotations, num_buckets, None if mask is None else mask[:, :, 0])
    np.testing.assert_array_equal(_numpy(buckets), expected_buckets)
    if padded:  # the padding tokens went into the extra bucket
        assert np.all(_numpy(buckets)[1, :, :, 11:] == np.prod(num_buckets))
    got = lsh_attention(
        query_key, query_key, value, attention_mask=mask, is_causal=is_decoder,
        num_hashes=2, num_buckets=num_buckets, chunk_length=4, rotations=rotations,
    )
    np.testing.assert_allclose(_numpy(got), expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "num_hashes, chunks_before, chunks_after, num_buckets",
    [(1, 1, 0, 8), (3, 0, 1, [2, 4]), (2, 2, 1, 4)],
)
def test_matches_transformers_with_other_windows_and_rounds(num_hashes, chunks_before, chunks_after, num_buckets):
    query_key, value, mask, rotations, expected, _ = _transformers_case(
        num_buckets, True, True, num_hashes=num_hashes, chunks_before=chunks_before, chunks_after=chunks_after, seed=1
    )
    got = lsh_attention(
        query_key, query_key, value, attention_mask=mask, is_causal=True, num_hashes=num_hashes,
        num_buckets=num_buckets, chunk_length=4, num_chunks_before=chunks_before, num_chunks_after=chunks_after,
        rotations=rotations,
    )
    np.testing.assert_allclose(_numpy(got), expected, atol=1e-5, rtol=0)


# --- reduction to full shared-QK attention -----------------------------------


def _full_shared_qk_attention(query_key, value, is_causal, key_mask=None):
    """Shared-QK softmax attention: unit-length keys (transformers' norm),
    no 1/√d, masked logits −1e9, the self-logit −1e5 (set last)."""
    dim = query_key.shape[-1]
    keys = query_key / np.sqrt(np.mean(query_key**2, -1, keepdims=True) + 1e-6) / np.sqrt(dim)
    logits = np.einsum("blnd,bsnd->bnls", query_key, keys).astype("float64")
    length = query_key.shape[1]
    allowed = np.ones((length, length), bool)
    if is_causal:
        allowed = np.tril(allowed)
    allowed = np.broadcast_to(allowed, logits.shape)
    if key_mask is not None:
        allowed = allowed & key_mask[:, None, None, :]
    logits = np.where(allowed, logits, -1e9)
    logits = np.where(np.eye(length, dtype=bool), -1e5, logits)
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    return np.einsum("bnls,bsnd->blnd", weights, value)


def _random(seed=0, length=LENGTH):
    rng = np.random.default_rng(seed)
    query_key = rng.normal(size=(BATCH, length, HEADS, HEAD_DIM)).astype("float32")
    value = rng.normal(size=(BATCH, length, HEADS, HEAD_DIM)).astype("float32")
    return query_key, value


@pytest.mark.parametrize("is_causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize(
    "num_hashes, chunk_length, chunks_before",
    [(1, 4, 3), (2, 4, 7), (2, 16, 1), (3, 32, 0)],
    ids=["window_covers_one_round", "window_covers_both_rounds", "one_chunk", "shorter_than_a_chunk"],
)
def test_equals_full_shared_qk_attention_when_the_window_covers_the_sequence(
    is_causal, num_hashes, chunk_length, chunks_before
):
    # Whatever the hashing, every query then sees every key (once per round,
    # which the combination of rounds normalises away), masked by position.
    query_key, value = _random()
    key_mask = np.ones((BATCH, LENGTH), bool)
    key_mask[0, 13:] = False
    expected = _full_shared_qk_attention(query_key, value, is_causal, key_mask)
    got = _numpy(lsh_attention(
        query_key, query_key, value, attention_mask=key_mask[:, None, None, :], is_causal=is_causal,
        num_hashes=num_hashes, num_buckets=4, chunk_length=chunk_length, num_chunks_before=chunks_before, seed=3,
    ))
    if is_causal and num_hashes > 1 and chunk_length < LENGTH:
        # The first token sees only itself, at logit −1e5, where float32 steps
        # by 2⁻⁷: a normaliser −1e5 + log 2 (two copies, or two rounds) is off
        # by up to 0.004, and so is the weight — transformers' arithmetic, kept
        # for parity (its own first-token outputs are off by 0.2–0.4% there).
        np.testing.assert_allclose(got[:, 0], value[:, 0], rtol=1e-2, atol=1e-6)
        got, expected = got[:, 1:], expected[:, 1:]
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)


def test_a_token_attends_to_itself_only_when_nothing_else_is_allowed():
    query_key, value = _random(1)
    got = _numpy(lsh_attention(query_key, query_key, value, is_causal=True, num_buckets=2, chunk_length=4, seed=0))
    np.testing.assert_allclose(got[:, 0], value[:, 0], atol=1e-6)  # the first token: only itself
    # A later token gives itself weight ≈ e^(−1e5): its output is a mix of earlier values only.
    full = _full_shared_qk_attention(query_key, value, is_causal=True)
    np.testing.assert_allclose(
        _numpy(lsh_attention(query_key, query_key, value, is_causal=True, num_buckets=2, chunk_length=4,
                             num_chunks_before=3, seed=0)),
        full, atol=1e-5,
    )


def test_a_general_mask_is_applied_pair_by_pair():
    # A (query, key) mask through the chunks equals the same mask on full attention.
    query_key, value = _random(2)
    rng = np.random.default_rng(5)
    pair_mask = rng.random((BATCH, 1, LENGTH, LENGTH)) < 0.6
    got = lsh_attention(
        query_key, query_key, value, attention_mask=pair_mask, num_hashes=1, num_buckets=4, chunk_length=4,
        num_chunks_before=3, seed=1,
    )
    dim = HEAD_DIM
    keys = query_key / np.sqrt(np.mean(query_key**2, -1, keepdims=True) + 1e-6) / np.sqrt(dim)
    logits = np.einsum("blnd,bsnd->bnls", query_key, keys)
    logits = np.where(pair_mask, logits, -1e9)
    logits = np.where(np.eye(LENGTH, dtype=bool), -1e5, logits)
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    expected = np.einsum("bnls,bsnd->blnd", weights / weights.sum(-1, keepdims=True), value)
    np.testing.assert_allclose(_numpy(got), expected, atol=1e-5, rtol=0)


# --- rotations, registration, layers -------------------------------------------


def test_seeded_rotations_repeat_and_given_rotations_decide():
    query_key, value = _random(3)
    options = dict(num_hashes=2, num_buckets=4, chunk_length=4)
    first = _numpy(lsh_attention(query_key, query_key, value, seed=11, **options))
    np.testing.assert_array_equal(_numpy(lsh_attention(query_key, query_key, value, seed=11, **options)), first)
    rotations = np.random.default_rng(0).normal(size=lsh_rotations_shape(HEADS, HEAD_DIM, 2, 4)).astype("float32")
    with_rotations = _numpy(lsh_attention(query_key, query_key, value, rotations=rotations, **options))
    np.testing.assert_array_equal(
        _numpy(lsh_attention(query_key, query_key, value, rotations=rotations, seed=99, **options)), with_rotations
    )
    generator = keras.random.SeedGenerator(4)
    drawn = _numpy(lsh_attention(query_key, query_key, value, seed_generator=generator, **options))
    assert np.all(np.isfinite(drawn)) and drawn.shape == value.shape


def test_registered_with_its_options():
    assert get_mechanism("lsh") is lsh_attention
    assert set(mechanism_options("lsh")) == {
        "num_hashes", "num_buckets", "chunk_length", "num_chunks_before", "num_chunks_after", "rotations", "seed",
    }


def test_runs_in_multi_head_attention_inside_a_compiled_model():
    from attention_zoo_keras.layers import MultiHeadAttention

    layer = MultiHeadAttention(
        num_heads=HEADS, head_dim=HEAD_DIM, attention="lsh",
        attention_options={"num_hashes": 2, "num_buckets": 4, "chunk_length": 4},
    )
    inputs = keras.Input((LENGTH, HIDDEN))
    model = keras.Model(inputs, layer(inputs, is_causal=True))
    hidden = np.random.default_rng(0).normal(size=(BATCH, LENGTH, HIDDEN)).astype("float32")
    out = model.predict(hidden, verbose=0)
    assert out.shape == (BATCH, LENGTH, HIDDEN) and np.all(np.isfinite(out))
    rotations = np.zeros(lsh_rotations_shape(HEADS, HEAD_DIM, 2, 4), "float32")
    direct = layer(hidden, is_causal=True, mechanism_arguments={"rotations": rotations})
    assert np.all(np.isfinite(_numpy(direct)))


def test_dropout_while_training():
    query_key, value = _random(4)
    options = dict(num_hashes=2, num_buckets=4, chunk_length=4, seed=0)
    plain = _numpy(lsh_attention(query_key, query_key, value, dropout_rate=0.5, **options))
    np.testing.assert_array_equal(plain, _numpy(lsh_attention(query_key, query_key, value, **options)))
    dropped = _numpy(lsh_attention(
        query_key, query_key, value, dropout_rate=0.5, training=True,
        seed_generator=keras.random.SeedGenerator(1), **options,
    ))
    assert np.all(np.isfinite(dropped)) and not np.allclose(dropped, plain)


# --- errors ---------------------------------------------------------------------


def test_length_not_a_multiple_of_chunk_length():
    query_key, value = _random(length=18)
    with pytest.raises(ValueError, match="sequence length 18 is not a multiple of chunk_length 4"):
        lsh_attention(query_key, query_key, value, num_buckets=4, chunk_length=4, seed=0)


@pytest.mark.parametrize("num_buckets", [3, 1, [2, 3], 0, []])
def test_odd_bucket_counts(num_buckets):
    query_key, value = _random()
    with pytest.raises(ValueError, match="num_buckets must be an even integer"):
        lsh_attention(query_key, query_key, value, num_buckets=num_buckets, chunk_length=4, seed=0)


def test_rotations_of_the_wrong_shape():
    query_key, value = _random()
    wrong = np.zeros((HEAD_DIM, HEADS, 2, 2), "float32")  # axes swapped
    with pytest.raises(ValueError, match=r"rotations must have shape .* = \(2, 8, 2, 2\).* got \(8, 2, 2, 2\)"):
        lsh_attention(query_key, query_key, value, num_hashes=2, num_buckets=4, chunk_length=4, rotations=wrong)
    factorised = np.zeros((HEADS, HEAD_DIM, 2, 4), "float32")  # [2, 2] needs (2 + 2) / 2 = 2 columns
    with pytest.raises(ValueError, match=r"\(2, 8, 2, 2\)"):
        lsh_attention(
            query_key, query_key, value, num_hashes=2, num_buckets=[2, 2], chunk_length=4, rotations=factorised
        )


@pytest.mark.parametrize(
    "options, message",
    [
        ({"num_hashes": 0}, "num_hashes must be a positive integer"),
        ({"chunk_length": 0}, "chunk_length must be a positive integer"),
        ({"num_chunks_before": -1}, "num_chunks_before must be a non-negative integer"),
    ],
)
def test_bad_options(options, message):
    query_key, value = _random()
    with pytest.raises(ValueError, match=message):
        lsh_attention(query_key, query_key, value, **{"num_buckets": 4, "chunk_length": 4, "seed": 0, **options})


def test_query_and_key_lengths_must_match():
    query_key, value = _random()
    with pytest.raises(ValueError, match="query and key lengths must be equal"):
        lsh_attention(query_key[:, :8], query_key, value, num_buckets=4, chunk_length=4, seed=0)
