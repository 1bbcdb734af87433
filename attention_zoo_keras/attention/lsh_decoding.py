"""Incremental decoding for LSH attention (`lsh.py`; Kitaev, Kaiser and
Levskaya, 2020, "Reformer: The Efficient Transformer", §2–3) as Hugging
Face transformers' Reformer generates with `past_buckets_states`: a prompt
pass, then one token at a time, each attending within the window it would
have if the sequence ended there. LSH attention does not decompose
causally, so this is *not* the full pass over the whole sequence; see
`LSHDecodingCache` for what it computes.
"""

import math

import numpy as np
from keras import ops

from attention_zoo_keras import backend_support
from attention_zoo_keras.attention.blocks import check_positive_int
from attention_zoo_keras.attention.blocks import check_self_attention
from attention_zoo_keras.attention.decoding import DecodingCache
from attention_zoo_keras.attention.lsh import DEFAULT_CHUNK_LENGTH
from attention_zoo_keras.attention.lsh import DEFAULT_NUM_CHUNKS_AFTER
from attention_zoo_keras.attention.lsh import DEFAULT_NUM_CHUNKS_BEFORE
from attention_zoo_keras.attention.lsh import DEFAULT_NUM_HASHES
from attention_zoo_keras.attention.lsh import attend_chunks
from attention_zoo_keras.attention.lsh import bucket_factors
from attention_zoo_keras.attention.lsh import check_rotations
from attention_zoo_keras.attention.lsh import combine_rounds
from attention_zoo_keras.attention.lsh import length_norm
from attention_zoo_keras.attention.lsh import lsh_attention
from attention_zoo_keras.attention.lsh import lsh_buckets
from attention_zoo_keras.attention.lsh import lsh_rotations_shape
from attention_zoo_keras.attention.lsh import real_tokens
from attention_zoo_keras.attention.lsh import seeded_rotations
from attention_zoo_keras.attention.masks import mask_4d
from attention_zoo_keras.attention.registry import register_decoding

DECODING_SEED = 0  # the rotations' seed when decoding is given neither `seed` nor `rotations`


def _decoding_rotations(rotations, seed, heads, head_dim, num_hashes, num_buckets):
    """The rotations every decoding call hashes with: `rotations`, or those
    of the int `seed` (default `DECODING_SEED`, `lsh.seeded_rotations`) — the
    same at every call, never from a layer's `SeedGenerator`."""
    expected = lsh_rotations_shape(heads, head_dim, num_hashes, num_buckets)
    check_rotations(rotations, expected, num_buckets)
    if rotations is not None:
        return rotations
    return seeded_rotations(expected, check_positive_int(DECODING_SEED if seed is None else seed, "seed", minimum=0))


def _window_positions(buckets, new_position, num_buckets, chunk_length, before, after):
    """The positions the query at `new_position` attends to in every round,
    `(B, N, n_h, W)` with `W = (before + 1 + after) · chunk_length`.

    `buckets` `(B, N, n_h, S)` holds the bucket of every slot; the written
    positions `0 … t` (`t = new_position`, `L = t + 1`) are sorted by
    `(bucket, position)` in each round, after which come the unwritten slots.
    Position `t` sorts last among its bucket, at rank `p`; the window is the
    sorted entries `(⌊p / c⌋ − before) · c + k`, `k = 0 … W − 1`, modulo
    `L` (transformers' `_expand_to_indices_in_relevant_chunk`): it wraps
    circularly, repeating positions when `W > L`."""
    slots = buckets.shape[-1]
    position = ops.arange(slots, dtype="int32")
    written = ops.less_equal(position, new_position)
    unwritten_bucket = ops.cast(math.prod(num_buckets) + 1, "int32")  # after every bucket, padding's included
    sort_key = ops.where(written, buckets, unwritten_bucket) * slots + position
    order = backend_support.argsort_distinct(sort_key)  # positions make every key distinct
    new_bucket = ops.take(buckets, new_position, axis=-1)[..., None]
    rank = ops.sum(ops.cast(ops.logical_and(written, ops.less_equal(buckets, new_bucket)), "int32"), axis=-1) - 1
    width = (before + 1 + after) * chunk_length
    start = (rank // chunk_length - before) * chunk_length
    sorted_index = ops.mod(start[..., None] + ops.arange(width, dtype="int32"), new_position + 1)  # wraps
    return ops.take_along_axis(order, sorted_index, axis=-1)


def _gather_positions(x, positions):
    """`x` `(B, N, S, D)` at `positions` `(B, N, R, W)` → `(B, N, R, W, D)`."""
    batch, heads = ops.shape(x)[0], x.shape[1]
    flat = ops.reshape(positions, (batch, heads, -1, 1))
    gathered = ops.take_along_axis(x, flat, axis=2)
    return ops.reshape(gathered, (batch, heads, positions.shape[2], positions.shape[3], x.shape[3]))


class LSHDecodingCache(DecodingCache):
    """Incremental (token-by-token) decoding for LSH attention, as Hugging
    Face transformers' Reformer generates with `past_buckets_states`
    (`ReformerAttention.forward`, `ReformerDynamicCache`,
    `LSHSelfAttention.forward` with a cache, `_get_relevant_hid_states_and_buckets`,
    `_expand_to_indices_in_relevant_chunk`, `_attend` with `use_cache`);
    position-addressed.

    **Not the full pass.** LSH attention does not decompose causally: a
    position's window depends on where every later position hashes. So this
    cache does *not* meet `DecodingCache`'s contract (the output equals the
    mechanism on the whole sequence); it computes what transformers computes
    when it decodes, which is this:

    *Prompt pass* (`T > 1` new positions, `cache_update_index = 0`): the
    ordinary `lsh_attention` over the `T` positions, with `attention_mask`
    (its first `T` key positions) and `is_causal`. Written to the cache:
    every position's shared query/key vector and value (transformers caches
    the layer-normed hidden states and projects them again; the projections
    are bias-free linear maps, so this is the same), every position's
    buckets, and per row the flag `hashed = T > chunk_length` — whether the
    pass hashed (transformers caches buckets only then; padding tokens keep
    the padding bucket `b = Π b_f`).

    *Step* (`T = 1`, the new position `t = cache_update_index`, the cache
    holding `0 … t − 1`, so `L = t + 1`): the new vector and value are
    written at `t` and its buckets hashed with the same rotations; then

    - without `hashed` (transformers: no buckets cached): plain shared-QK
      attention of the query over all `L` positions,
      `o = Σ_{j ≤ t} softmax_j(s_j) v_j`, `s_j = q · k̂_j` with the
      normalised keys `k̂` of the full pass and the self-mask
      `s_t = −10⁵`. Once `L ≥ chunk_length`, `hashed` is set (transformers
      then hashes all `L` positions and caches their buckets);
    - with `hashed`, per round `r`: the `L` positions are stable-sorted by
      (bucket in round r, position); the new position sorts last among its
      bucket, at rank `p`; its window `P^(r)` is the `W = (num_chunks_before
      + 1 + num_chunks_after) · chunk_length` sorted entries from
      `(⌊p / c⌋ − num_chunks_before) · c` on, taken modulo `L` — so they
      wrap around, and when `L < W` or `L` is not a multiple of
      `chunk_length` a position can appear more than once, each copy
      counting (reproduced exactly). The query attends over its window with
      the self-mask on every copy of itself, `o^(r)`, `z^(r)` as in the full
      pass, and the rounds are combined by their normalisers
      `o = Σ_r exp(z^(r) − logsumexp_r' z^(r')) o^(r)` (Kitaev et al.,
      2020, §2 "Multi-round LSH attention", §3 shared-QK self-mask).

    A step applies no other mask: neither `attention_mask` nor `is_causal`
    (transformers passes none while generating; every position it sees is
    earlier). Slots after `t` hold stale vectors and are ignored, so a
    position may be fed again (it is rewritten). At `t = 0` a step is a
    one-token prompt: only the token itself, and `hashed` is cleared.

    Consequences: a step's window is the chunk it *would* fall in if the
    sequence ended at `t` — not the window the full pass gives position `t`
    over a longer sequence, and it changes with the prompt's length: a
    prompt pass padded beyond `chunk_length` sets `hashed` even when the real
    prompt is shorter, and the next step at `t` then uses the hashed windows
    of only `t + 1` positions (transformers does the same when its model
    pads such a prompt).

    **Rotations** are `rotations` if given, else a standard normal draw of
    numpy's generator seeded with the int `seed` (default `DECODING_SEED`):
    the same for the prompt pass and every step, on every backend (never
    the layer's `seed_generator`; a constant, so they survive tracing: a
    `keras.random.normal` inside a `torch.jit.trace`d step is replayed with
    an advancing generator) — for the same `seed`, `lsh_attention`'s own.
    transformers without
    `config.hash_seed` draws new rotations at every call, so its cached
    buckets and each step's hash disagree; with `hash_seed` both agree, as
    here.

    Not reproduced, transformers' inconsistencies: (1) a step gathers every
    batch row's keys and values from row 0's cached states (its
    `_get_relevant_hid_states_and_buckets` adds a batch offset that is
    always 0), so only batch size 1 is right there; here each row uses its
    own. (2) After a prompt with padding its cached buckets are offset `b +
    1` apart per round; a step guesses the spacing from the largest cached
    bucket and may offset its own by `b`, which with `num_hashes > 1` sorts
    the new position as if its round-r bucket were `r` lower; here buckets
    are compared within a round, unshifted.

    **Cache** (every tensor's axis 0 is the batch), a tuple:
    `(query_key (B, S, N, D), value (B, S, N, D), buckets (B, S, N, n_h)
    int32, hashed (B,) bool)` with `S = max_length`; all must come from one
    `initial_cache` with the call's `num_hashes`.

    **Cost** per step and head: `O(S·D)` for the plain branch and `O(n_h·(S
    log S + W·D))` for the hashed one (both are computed, and each row takes
    its own; shapes are static, so the step compiles in a loop with a tensor
    `cache_update_index`). transformers re-projects all `L` cached states
    (or the `n_h·W` in the windows) at every step.

    Raises (from `attend_with_cache`):
        ValueError: without `num_buckets` (the default depends on the
            sequence length, which grows while decoding; transformers
            without `config.num_buckets` fails when a short prompt's steps
            reach `chunk_length`), for several new
            positions anywhere but at `cache_update_index = 0` (as
            transformers, LSH decoding feeds one token at a time), or for a
            cache made for another `num_hashes`.

    Example:

    >>> import numpy as np
    >>> decoding = LSHDecodingCache()
    >>> options = dict(num_hashes=2, num_buckets=4, chunk_length=4)
    >>> cache = decoding.initial_cache(1, 12, num_heads=2, head_dim=8, dtype="float32", **options)
    >>> x = np.random.rand(1, 9, 2, 8).astype("float32")
    >>> out, cache = decoding.attend_with_cache(x[:, :8], x[:, :8], x[:, :8], cache, 0, **options)
    >>> out, cache = decoding.attend_with_cache(x[:, 8:], x[:, 8:], x[:, 8:], cache, 8, **options)
    >>> tuple(out.shape), [tuple(t.shape) for t in cache]
    ((1, 1, 2, 8), [(1, 12, 2, 8), (1, 12, 2, 8), (1, 12, 2, 2), (1,)])
    """

    position_addressed = True

    def initial_cache(self, batch, max_length, num_heads, head_dim, dtype, num_hashes=DEFAULT_NUM_HASHES, **options):
        """The empty cache `(query_key, value, buckets, hashed)`: zeros
        `(batch, max_length, num_heads, head_dim)` twice in `dtype`, int32
        zeros `(batch, max_length, num_heads, num_hashes)`, and `False`
        `(batch,)`."""
        del options
        num_hashes = check_positive_int(num_hashes, "num_hashes")
        vectors = (batch, max_length, num_heads, head_dim)
        return (
            ops.zeros(vectors, dtype=dtype),
            ops.zeros(vectors, dtype=dtype),
            ops.zeros((batch, max_length, num_heads, num_hashes), dtype="int32"),
            ops.zeros((batch,), dtype="bool"),
        )

    def attend_with_cache(
        self,
        query,
        key,
        value,
        cache,
        cache_update_index,
        attention_mask=None,
        is_causal=True,
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
    ):
        """The prompt pass (`T > 1`, at `cache_update_index = 0`) or one
        step (`T = 1`); see the class docstring and
        `DecodingCache.attend_with_cache`. The options are `lsh_attention`'s;
        `num_buckets` is required."""
        check_self_attention(query, key, value, "LSH")
        if num_buckets is None:
            raise ValueError(
                "LSH decoding needs num_buckets: its default depends on the sequence length, which grows "
                "while decoding, and the prompt pass and every step must hash alike."
            )
        factors = bucket_factors(num_buckets)
        num_hashes = check_positive_int(num_hashes, "num_hashes")
        chunk_length = check_positive_int(chunk_length, "chunk_length")
        before = check_positive_int(num_chunks_before, "num_chunks_before", minimum=0)
        after = check_positive_int(num_chunks_after, "num_chunks_after", minimum=0)
        if cache[2].shape[-1] != num_hashes:
            raise ValueError(
                f"This LSH decoding cache holds buckets of {cache[2].shape[-1]} hashing rounds, but the call has "
                f"num_hashes={num_hashes}: pass the same options to initial_cache."
            )
        new_positions, heads, head_dim = key.shape[1], key.shape[2], key.shape[3]
        rotations = _decoding_rotations(rotations, seed, heads, head_dim, num_hashes, factors)
        if new_positions == 1:
            return self._step(
                query, key, value, cache, cache_update_index, rotations, factors, chunk_length, before, after,
                dropout_rate, training, seed_generator,
            )
        if isinstance(cache_update_index, bool) or not (
            isinstance(cache_update_index, (int, np.integer)) and cache_update_index == 0
        ):
            raise ValueError(
                "LSH decoding feeds one token at a time after the prompt pass (as transformers' Reformer): "
                f"a call with {new_positions} new positions must be the prompt pass, at cache_update_index=0 "
                f"(a Python int); got {cache_update_index!r}."
            )
        if attention_mask is not None:  # over absolute positions: the prompt's are the first T
            attention_mask = mask_4d(attention_mask, new_positions, None)[..., :new_positions]
        output = lsh_attention(
            query, key, value, attention_mask=attention_mask, is_causal=is_causal, dropout_rate=dropout_rate,
            training=training, seed_generator=seed_generator, num_hashes=num_hashes, num_buckets=factors,
            chunk_length=chunk_length, num_chunks_before=before, num_chunks_after=after, rotations=rotations,
        )
        return output, self._prompt_cache(key, value, cache, attention_mask, rotations, factors, chunk_length)

    def _prompt_cache(self, key, value, cache, attention_mask, rotations, num_buckets, chunk_length):
        """The cache after a prompt pass over `key`, `value` `(B, T, N, D)`
        under the 4D `attention_mask` over those `T` positions (or `None`)."""
        query_key_cache, value_cache, bucket_cache, hashed = cache
        length = key.shape[1]
        hashes = length > chunk_length  # whether the pass hashed (static)
        token_mask = None
        if hashes and attention_mask is not None:  # padding gets the padding bucket, as in the pass
            token_mask = real_tokens(attention_mask)
        buckets = ops.transpose(lsh_buckets(key, rotations, num_buckets, token_mask), (0, 3, 1, 2))
        rows = min(length, query_key_cache.shape[1])
        return (
            backend_support.write_rows(query_key_cache, 0, ops.cast(key[:, :rows], query_key_cache.dtype)),
            backend_support.write_rows(value_cache, 0, ops.cast(value[:, :rows], value_cache.dtype)),
            backend_support.write_rows(bucket_cache, 0, buckets[:, :rows]),
            ops.full(ops.shape(hashed), hashes, dtype="bool"),
        )

    def _step(
        self, query, key, value, cache, cache_update_index, rotations, num_buckets, chunk_length, before, after,
        dropout_rate, training, seed_generator,
    ):
        """One new position `t = cache_update_index`: the cache written at
        `t`, the query attending over `0 … t` plainly or within its hashed
        windows, row by row."""
        query_key_cache, value_cache, bucket_cache, hashed = cache
        t = ops.cast(ops.convert_to_tensor(cache_update_index), "int32")
        new_buckets = lsh_buckets(key, rotations, num_buckets)  # (B, N, n_h, 1)
        query_key_cache = backend_support.write_rows(query_key_cache, t, ops.cast(key, query_key_cache.dtype))
        value_cache = backend_support.write_rows(value_cache, t, ops.cast(value, value_cache.dtype))
        bucket_cache = backend_support.write_rows(bucket_cache, t, ops.transpose(new_buckets, (0, 3, 1, 2)))

        batch, heads = ops.shape(query)[0], query.shape[2]
        num_hashes, slots = bucket_cache.shape[3], bucket_cache.shape[1]
        query_t = ops.transpose(query, (0, 2, 1, 3))[:, :, :, None]  # (B, N, 1, 1, D)
        keys = length_norm(ops.transpose(query_key_cache, (0, 2, 1, 3)))  # (B, N, S, D), float32
        values = ops.transpose(value_cache, (0, 2, 1, 3))
        query_position = ops.broadcast_to(t, (batch, heads, 1, 1))
        attend = dict(
            mask=None, length=slots, dropout_rate=dropout_rate, training=training, seed_generator=seed_generator
        )

        # Without buckets: over every written position (causality keeps out the unwritten slots).
        every_position = ops.broadcast_to(ops.arange(slots, dtype="int32"), (batch, heads, 1, slots))
        plain, _ = attend_chunks(
            query_t, keys[:, :, None], values[:, :, None], query_position, every_position, is_causal=True, **attend
        )

        # With buckets: the window of every round, then the rounds combined.
        window = _window_positions(
            ops.transpose(bucket_cache, (0, 2, 3, 1)), t, num_buckets, chunk_length, before, after
        )  # (B, N, n_h, W)
        per_round, normaliser = attend_chunks(
            ops.broadcast_to(query_t, (batch, heads, num_hashes, 1, query.shape[3])),
            _gather_positions(keys, window),
            _gather_positions(values, window),
            ops.broadcast_to(t, (batch, heads, num_hashes, 1)),
            window,
            is_causal=False,
            **attend,
        )
        hashed_windows = combine_rounds(per_round, normaliser, value.dtype)  # (B, N, 1, M)

        use_buckets = ops.logical_and(hashed, ops.greater(t, 0))
        output = ops.where(use_buckets[:, None, None, None], hashed_windows, plain[:, :, 0])
        hashed = ops.logical_and(ops.greater(t, 0), ops.logical_or(hashed, ops.greater_equal(t + 1, chunk_length)))
        return ops.transpose(output, (0, 2, 1, 3)), (query_key_cache, value_cache, bucket_cache, hashed)


register_decoding("lsh", LSHDecodingCache())
