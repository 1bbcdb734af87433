"""LSH attention — Kitaev, Kaiser and Levskaya, 2020, "Reformer: The
Efficient Transformer" (ICLR 2020), §2–3, as Hugging Face `transformers`
implements it (`LSHSelfAttention`), which this reproduces exactly given the
same random rotations.

Queries and keys are one projection; keys are normalised, k̂_j ≈ k_j/‖k_j‖.
In each hashing round r a random rotation R puts x in bucket
h(x) = argmax([xR ; −xR]); the (round, position) pairs are sorted by bucket
and cut into chunks of `chunk_length`, and each chunk attends to itself and
its neighbouring chunks P_i^(r):

    o_i^(r) = Σ_{j ∈ P_i^(r)} exp(s_ij − z_i^(r)) v_j,   s_ij = q_i · k̂_j,
    z_i^(r) = logsumexp_{j ∈ P_i^(r)} s_ij,
    o_i     = Σ_r exp(z_i^(r) − logsumexp_r' z_i^(r')) o_i^(r)

with s_ii = −10⁵ (a token attends to itself only when nothing else is
allowed) and −10⁹ for pairs the causal or attention mask forbids. Time
O(B·N·n_h·L·W·d) plus the sort, W = (1 + before + after)·chunk_length.

`docs/attention/lsh.md` holds the whole description (factorised buckets,
the circular chunks, padding, rotations and seeds, numerics, decoding).
"""

import functools
import math

import numpy as np
from keras import ops
from keras import random

from attention_zoo_keras import backend_support
from attention_zoo_keras.attention.blocks import check_positive_int
from attention_zoo_keras.attention.blocks import check_self_attention
from attention_zoo_keras.attention.blocks import cyclic_neighbours
from attention_zoo_keras.attention.masks import mask_4d
from attention_zoo_keras.attention.registry import register_mechanism

DEFAULT_NUM_HASHES = 1
DEFAULT_CHUNK_LENGTH = 64  # transformers' ReformerConfig.lsh_attn_chunk_length
DEFAULT_NUM_CHUNKS_BEFORE = 1
DEFAULT_NUM_CHUNKS_AFTER = 0
MASK_VALUE = -1e9  # transformers' mask_value_float32
SELF_MASK_VALUE = -1e5  # transformers' self_mask_value_float32
NORM_EPSILON = 1e-6  # transformers' _len_norm


def bucket_factors(num_buckets):
    """`num_buckets` (an even int, or a list of even ints for factorised
    buckets) as a tuple of factors; raises `ValueError` otherwise."""
    factors = (num_buckets,) if isinstance(num_buckets, (int, np.integer)) else num_buckets
    try:
        factors = tuple(factors)
    except TypeError:
        factors = ()
    if not factors or any(
        isinstance(f, bool) or not isinstance(f, (int, np.integer)) or f < 2 or f % 2 for f in factors
    ):
        raise ValueError(
            "num_buckets must be an even integer ≥ 2 (angular LSH takes the argmax over [xR; −xR], so "
            f"every bucket count is even), or a list of them for factorised buckets; got {num_buckets!r}."
        )
    return tuple(int(f) for f in factors)


def lsh_rotations_shape(num_heads, head_dim, num_hashes, num_buckets):
    """The shape of LSH attention's random rotations,
    `(num_heads, head_dim, num_hashes, Σ b_f / 2)` — transformers' layout.

    >>> lsh_rotations_shape(2, 8, num_hashes=4, num_buckets=[4, 8])
    (2, 8, 4, 6)
    """
    return (int(num_heads), int(head_dim), int(num_hashes), sum(bucket_factors(num_buckets)) // 2)


def default_num_buckets(length, chunk_length):
    """transformers' choice when `config.num_buckets` is unset: the largest
    power of two ≤ `2 · length // chunk_length` (at least 2). (transformers
    also factorises it beyond a limit set by `max_position_embeddings`; pass
    a list for that.)"""
    return max(2, 2 ** ((2 * (length // chunk_length)).bit_length() - 1))


def lsh_buckets(vectors, rotations, num_buckets, token_mask=None):
    """The bucket of every position in every hashing round.

    Args:
        vectors: tensor of shape `(batch, length, num_heads, head_dim)`.
            The shared query/key vectors.
        rotations: tensor of shape `(num_heads, head_dim, num_hashes,
            Σ b_f / 2)`. The random rotations.
        num_buckets: int or list of int. An even int, or a list of even ints
            (factorised).
        token_mask: bool tensor or None. Broadcastable to `(batch,
            num_heads, length)`, `False` for padding tokens.

    Returns:
        int32 `(batch, num_heads, num_hashes, length)`: `0 … b − 1`, and `b`
        (= Π b_f, the padding bucket) for padding tokens. transformers'
        `buckets` output less its round offsets.

    Example:

    >>> import numpy as np
    >>> x = np.random.rand(1, 6, 2, 4).astype("float32")
    >>> r = np.random.randn(2, 4, 3, 2).astype("float32")
    >>> b = lsh_buckets(x, r, num_buckets=4)
    >>> tuple(b.shape), bool(np.all((np.asarray(b) >= 0) & (np.asarray(b) < 4)))
    ((1, 2, 3, 6), True)
    """
    factors = bucket_factors(num_buckets)
    rotations = ops.cast(rotations, vectors.dtype)
    rotated = ops.einsum("blnd,ndhr->bnhlr", vectors, rotations)
    buckets, start, product = None, 0, 1
    for factor in factors:
        piece = rotated[..., start : start + factor // 2]
        start += factor // 2
        # argmax([xR; −xR]) without building it: the first half wins ties, as argmax's first occurrence.
        in_first_half = ops.max(piece, axis=-1) >= -ops.min(piece, axis=-1)
        bucket = ops.where(
            in_first_half, ops.argmax(piece, axis=-1), ops.argmin(piece, axis=-1) + factor // 2
        )
        bucket = ops.cast(bucket, "int32")
        buckets = bucket if buckets is None else buckets + product * bucket
        product *= factor
    if token_mask is not None:
        token_mask = ops.cast(token_mask, "bool")
        while len(token_mask.shape) < 3:
            token_mask = ops.expand_dims(token_mask, 0)
        buckets = ops.where(token_mask[:, :, None, :], buckets, ops.cast(product, "int32"))
    return buckets


@functools.lru_cache(maxsize=16)
def seeded_rotations(shape, seed):
    """Standard-normal float32 rotations of `shape` from numpy's generator
    seeded with `seed`: the same on every backend, and a constant under
    tracing (a traced `keras.random.normal` would, under `torch.jit.trace`,
    replay with an advancing generator: new rotations at every step)."""
    rotations = np.random.default_rng(seed).standard_normal(shape).astype("float32")
    rotations.flags.writeable = False
    return rotations


def length_norm(key):
    """transformers' `_len_and_dim_norm`: `k / (√(mean(k²) + ε) · √d)`, in float32."""
    head_dim = key.shape[-1]
    key = ops.cast(key, "float32")
    normalised = key * ops.rsqrt(ops.mean(ops.square(key), axis=-1, keepdims=True) + NORM_EPSILON)
    return normalised / np.float32(math.sqrt(head_dim))


def _key_mask_at(mask, key_position, batch, heads, length):
    """A key-only `(B|1, N|1, 1, L)` mask at `key_position` `(B, N, K, W)` →
    `(B, N, K, 1, W)`."""
    keys = ops.broadcast_to(mask[:, :, 0, :], (batch, heads, length))
    flat = ops.reshape(key_position, (batch, heads, -1))
    gathered = ops.take_along_axis(keys, flat, axis=2)
    return ops.expand_dims(ops.reshape(gathered, ops.shape(key_position)), 3)


def _pair_mask_at(mask, query_position, key_position, batch, heads, length):
    """A `(B|1, N|1, L, L|1)` mask at (query, key) positions `(B, N, K, c)`
    and `(B, N, K, W)` → `(B, N, K, c, W)`."""
    pairs = ops.reshape(ops.broadcast_to(mask, (batch, heads, length, length)), (batch, heads, -1))
    index = query_position[..., :, None] * length + key_position[..., None, :]
    gathered = ops.take_along_axis(pairs, ops.reshape(index, (batch, heads, -1)), axis=2)
    return ops.reshape(gathered, ops.shape(index))


def check_rotations(rotations, expected, num_buckets):
    """Raises `ValueError` unless `rotations` is `None` or of shape `expected`."""
    if rotations is not None and tuple(rotations.shape) != expected:
        heads, head_dim, num_hashes = expected[:3]
        raise ValueError(
            f"rotations must have shape (num_heads, head_dim, num_hashes, sum(num_buckets) // 2) = "
            f"{expected} for {heads} heads of {head_dim}, num_hashes={num_hashes} and "
            f"num_buckets={num_buckets!r}; got {tuple(rotations.shape)}."
        )


def real_tokens(mask):
    """`(B|1, N|1, L)` from a `(B|1, N|1, L|1, L)` mask: `False` for the keys
    no query may attend to (padding)."""
    return mask[:, :, 0, :] if mask.shape[2] == 1 else ops.any(mask, axis=2)


def combine_rounds(output, normaliser, dtype):
    """The rounds' outputs `(B, N, n_h, L, M)` weighted by their float32
    normalisers `(B, N, n_h, L)`, `exp(z^(r) − logsumexp_r' z^(r'))`, summed
    over the rounds: `(B, N, L, M)` in `dtype`."""
    weights = ops.exp(normaliser - ops.logsumexp(normaliser, axis=2, keepdims=True))
    return ops.cast(ops.sum(ops.cast(output, "float32") * weights[..., None], axis=2), dtype)


def attend_chunks(
    query, key, value, query_position, key_position, mask, is_causal, length, dropout_rate, training, seed_generator
):
    """Chunks of queries `(B, N, K, c, D)` over their windows of normalised
    keys `(B, N, K, W, D)` and values `(B, N, K, W, M)`, positions
    `(B, N, K, c)` / `(B, N, K, W)`. Returns the outputs `(B, N, K, c, M)`
    and float32 normalisers `(B, N, K, c)`."""
    batch, heads = ops.shape(query)[0], query.shape[1]
    logits = ops.einsum("bnkcd,bnkwd->bnkcw", ops.cast(query, "float32"), key)
    same = ops.equal(query_position[..., :, None], key_position[..., None, :])
    allowed = None
    if mask is not None:
        if mask.shape[2] == 1:
            allowed = _key_mask_at(mask, key_position, batch, heads, length)
        else:
            allowed = _pair_mask_at(mask, query_position, key_position, batch, heads, length)
    if is_causal:
        causal = ops.greater_equal(query_position[..., :, None], key_position[..., None, :])
        allowed = causal if allowed is None else ops.logical_and(allowed, causal)
    if allowed is not None:
        logits = ops.where(allowed, logits, np.float32(MASK_VALUE))
    logits = ops.where(same, np.float32(SELF_MASK_VALUE), logits)
    normaliser = ops.logsumexp(logits, axis=-1, keepdims=True)
    probabilities = ops.exp(logits - normaliser)
    if training and dropout_rate > 0.0:
        probabilities = random.dropout(probabilities, dropout_rate, seed=seed_generator)
    output = ops.einsum("bnkcw,bnkwm->bnkcm", ops.cast(probabilities, value.dtype), value)
    return output, normaliser[..., 0]


@register_mechanism("lsh", hash_rounds=True)
def lsh_attention(
    query,
    key,
    value,
    attention_mask=None,
    is_causal=False,
    dropout_rate=0.0,
    training=False,
    seed_generator=None,
    num_hashes=DEFAULT_NUM_HASHES,
    num_buckets=None,
    chunk_length=DEFAULT_CHUNK_LENGTH,
    num_chunks_before=DEFAULT_NUM_CHUNKS_BEFORE,
    num_chunks_after=DEFAULT_NUM_CHUNKS_AFTER,
    rotations=None,
    seed=None,
    separate_rounds=False,
):
    """Reformer LSH self-attention over `(batch, length, num_heads, head_dim)`,
    equal to transformers' `LSHSelfAttention` (before its output
    projection) given the same rotations. See `docs/attention/lsh.md`.

    Args:
        query: tensor of shape `(B, L, N, D)`. The queries; the Reformer's
            shared query/key vectors.
        key: tensor of shape `(B, L, N, D)`. The keys; pass `key = query`.
            The hashing and the sort use `key`; with separate queries the
            result is defined, but a query is no longer grouped with its
            near keys.
        value: tensor of shape `(B, L, N, M)`. The values.
        attention_mask: bool tensor or None. Broadcastable to `(B, N, L, L)`,
            `True` where a query may attend to a key; keys that no query may
            attend to are padding and get a bucket of their own (a
            key-padding mask `(B, 1, 1, L)` is the Reformer's case, and the
            cheapest).
        is_causal: bool. Mask keys after the query by original position
            (transformers' `is_decoder`).
        dropout_rate: float. Dropout on the attention probabilities of
            every round while training.
        training: bool. Whether dropout is active.
        seed_generator: `keras.random.SeedGenerator` or None. The dropout's
            seed generator, and the rotations' when neither `rotations` nor
            `seed` is given.
        num_hashes: int. Hashing rounds n_h.
        num_buckets: int, list of int or None. An even int, or a list of
            even ints for factorised buckets (`[b₁, b₂]`: b₁·b₂ buckets from
            `(b₁ + b₂)/2` rotation columns); `None` picks
            `default_num_buckets(L, chunk_length)`.
        chunk_length: int. Entries of the sorted sequence per chunk; `L`
            must be a multiple of it, or at most it (then plain shared-QK
            attention, no hashing).
        num_chunks_before: int. Earlier chunks (in sorted order) each chunk
            also attends to.
        num_chunks_after: int. Later chunks (in sorted order) each chunk
            also attends to.
        rotations: tensor of shape `(N, D, num_hashes, Σ b_f / 2)`, or None.
            Random rotations (`lsh_rotations_shape`), transformers' layout;
            a layer passes them per call through
            `mechanism_arguments={"rotations": r}`. `None` draws them from a
            standard normal.
        seed: int or None. The seed of the rotations (numpy's generator:
            the same every call and on every backend, and what decoding
            uses).
        separate_rounds: bool. Whether to return each hashing round's
            output, before the rounds are combined, side by side:
            `(B, L, N, n_h·M)`, round by round (one round without hashing,
            `L ≤ chunk_length`). What `attention_probabilities(...,
            hash_rounds=True)` reads; not a layer option.

    Returns:
        `(B, L, N, M)`.

    Raises:
        ValueError: for a length that is neither a multiple of
            `chunk_length` nor at most it, odd bucket counts, rotations of
            the wrong shape, unequal query and key lengths, or
            `num_buckets=None` with a length unknown while tracing.

    Example:

    >>> import numpy as np
    >>> qk = np.random.rand(2, 16, 4, 8).astype("float32")
    >>> v = np.random.rand(2, 16, 4, 8).astype("float32")
    >>> out = lsh_attention(qk, qk, v, is_causal=True, num_hashes=2, num_buckets=4, chunk_length=4, seed=0)
    >>> tuple(out.shape)
    (2, 16, 4, 8)
    """
    check_self_attention(query, key, value, "LSH")
    num_hashes = check_positive_int(num_hashes, "num_hashes")
    chunk_length = check_positive_int(chunk_length, "chunk_length")
    before = check_positive_int(num_chunks_before, "num_chunks_before", minimum=0)
    after = check_positive_int(num_chunks_after, "num_chunks_after", minimum=0)
    length, heads, head_dim = key.shape[1], key.shape[2], key.shape[3]
    if length is None and num_buckets is None:
        raise ValueError(
            "num_buckets=None takes the number of buckets from the sequence length, which is unknown here "
            f"(key shape {tuple(key.shape)}); give num_buckets."
        )
    if length is None:  # unknown while tracing (a TensorFlow graph of any width)
        length = ops.shape(key)[1]
    elif length > chunk_length and length % chunk_length:
        raise ValueError(
            f"The sequence length {length} is not a multiple of chunk_length {chunk_length}: LSH "
            "attention cuts the sorted sequence into whole chunks (pad the inputs to a multiple, as the "
            "Reformer model does, or choose a chunk_length that divides the length)."
        )
    if num_buckets is None:
        num_buckets = default_num_buckets(length, chunk_length)
    factors = bucket_factors(num_buckets)
    expected = lsh_rotations_shape(heads, head_dim, num_hashes, factors)
    check_rotations(rotations, expected, num_buckets)

    mask = None if attention_mask is None else mask_4d(attention_mask, length, length)
    query_t = ops.transpose(query, (0, 2, 1, 3))  # (B, N, L, D)
    key_t = ops.transpose(key, (0, 2, 1, 3))
    value_t = ops.transpose(value, (0, 2, 1, 3))
    batch, value_dim = ops.shape(query_t)[0], value.shape[3]

    def standard_attention():  # transformers' do_standard_self_attention: one chunk, no hashing
        position = ops.broadcast_to(ops.arange(length, dtype="int32"), (batch, heads, 1, length))
        output, _ = attend_chunks(
            query_t[:, :, None], length_norm(key_t)[:, :, None], value_t[:, :, None], position, position, mask,
            is_causal, length, dropout_rate, training, seed_generator,
        )
        return ops.transpose(output[:, :, 0], (0, 2, 1, 3))

    def hashed_attention():
        hashing = rotations
        if hashing is None and seed is not None:
            hashing = seeded_rotations(expected, check_positive_int(seed, "seed", minimum=0))
        elif hashing is None:
            # Drawn in float32 whatever the compute dtype, so that a seed hashes alike in every precision.
            hashing = random.normal(expected, dtype="float32", seed=seed_generator)
        token_mask = None
        if mask is not None:
            token_mask = real_tokens(mask)
        buckets = lsh_buckets(key, hashing, factors, token_mask)  # (B, N, n_h, L)

        # Sort the n_h·L (round, position) entries by (round, bucket, position).
        rounds_apart = math.prod(factors) + 1  # with the padding bucket
        offsets = ops.arange(num_hashes, dtype="int32")[:, None] * rounds_apart
        sort_keys = (buckets + offsets) * length + ops.arange(length, dtype="int32")
        sort_keys = ops.reshape(sort_keys, (batch, heads, num_hashes * length))
        # Every sort key is distinct, so any argsort is the stable one.
        order = backend_support.argsort_distinct(sort_keys)  # flat entries r·L + i
        undo_order = backend_support.argsort_distinct(order)
        position = order % length

        gather = position[..., None]
        num_chunks = num_hashes * length // chunk_length
        chunk_position = ops.reshape(position, (batch, heads, num_chunks, chunk_length))
        sorted_query = ops.take_along_axis(query_t, gather, axis=2)
        sorted_key = length_norm(ops.take_along_axis(key_t, gather, axis=2))
        sorted_value = ops.take_along_axis(value_t, gather, axis=2)
        output, normaliser = attend_chunks(
            ops.reshape(sorted_query, (batch, heads, num_chunks, chunk_length, head_dim)),
            cyclic_neighbours(
                ops.reshape(sorted_key, (batch, heads, num_chunks, chunk_length, head_dim)), before, after, axis=2
            ),
            cyclic_neighbours(
                ops.reshape(sorted_value, (batch, heads, num_chunks, chunk_length, value_dim)), before, after,
                axis=2,
            ),
            chunk_position,
            cyclic_neighbours(chunk_position, before, after, axis=2),
            mask, is_causal, length, dropout_rate, training, seed_generator,
        )

        # Back to (round, position) order, then one softmax over the rounds.
        output = ops.take_along_axis(
            ops.reshape(output, (batch, heads, num_hashes * length, value_dim)), undo_order[..., None], axis=2
        )
        normaliser = ops.take_along_axis(ops.reshape(normaliser, (batch, heads, -1)), undo_order, axis=2)
        output = ops.reshape(output, (batch, heads, num_hashes, length, value_dim))
        normaliser = ops.reshape(normaliser, (batch, heads, num_hashes, length))
        if separate_rounds:
            return ops.reshape(ops.transpose(output, (0, 3, 1, 2, 4)), (batch, length, heads, num_hashes * value_dim))
        return ops.transpose(combine_rounds(output, normaliser, value.dtype), (0, 2, 1, 3))

    if isinstance(length, int):
        return standard_attention() if length <= chunk_length else hashed_attention()
    return ops.cond(length <= chunk_length, standard_attention, hashed_attention)
