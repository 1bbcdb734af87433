"""What an attention layer keeps between decoding steps: the protocol
(`DecodingCache`) and the key/value cache (`KeyValueCache`) that every
mechanism attending over stored keys and values decodes with (softmax,
relative, Transformer-XL, additive, local, sparse). A mechanism registers
its decoding with `registry.register_decoding`; the recurrent state of
linear attention (`linear_decoding.RecurrentState`) and LSH attention's cache
(`lsh_decoding.LSHDecodingCache`) live beside their mechanisms.
"""

import abc

from keras import ops

from attention_zoo_keras import backend_support
from attention_zoo_keras.attention.masks import causal_mask


class DecodingCache(abc.ABC):
    """The decoding protocol: what one attention layer keeps between
    decoding steps, and how new positions attend with it.

    Causal self-attention over positions `0 … t0 + T − 1`, of which the
    cache summarises `0 … t0 − 1` and the call brings the `T` new ones
    `t0 … t0 + T − 1` (`t0 = cache_update_index`), must give the same output
    for the new queries as the mechanism on the whole sequence:

        (output, new_cache) = attend_with_cache(Q_new, K_new, V_new, cache, t0)
        output == mechanism(Q, K, V, is_causal=True)[:, t0 : t0 + T]

    One exception: LSH attention's chunks depend on the whole sequence, so
    no cache can reproduce its full pass; `lsh_decoding.LSHDecodingCache` decodes as
    the Reformer's reference implementation does instead.

    Attributes:
        position_addressed: bool. `True` if the cache stores each position in its
            own slot (a key/value cache): writing a position again replaces
            it, so a caller may re-feed positions. `False` if it is a running
            summary (a recurrent state): every position must be fed exactly
            once, in order, and the cache has no `max_length` dimension.

    Example (the softmax key/value cache; the linear recurrent state has the
    same interface):

    >>> import numpy as np
    >>> from attention_zoo_keras.attention import get_decoding
    >>> decoding = get_decoding("softmax")
    >>> cache = decoding.initial_cache(2, 8, num_heads=4, head_dim=16, dtype="float32")
    >>> x = np.random.rand(2, 3, 4, 16).astype("float32")
    >>> out, cache = decoding.attend_with_cache(x, x, x, cache, cache_update_index=0)
    >>> tuple(out.shape), decoding.position_addressed
    ((2, 3, 4, 16), True)
    """

    position_addressed = True
    resizable = False

    @abc.abstractmethod
    def initial_cache(self, batch, max_length, num_heads, head_dim, dtype, **options):
        """The empty cache of one layer, a (nested) tuple of tensors whose
        axis 0 is the batch (so beam search reorders it with `ops.take`).

        Args:
            batch: int. The number of sequences.
            max_length: int. The longest total length the cache must hold
                (ignored by caches that are not position-addressed).
            num_heads: int. The layer's number of heads.
            head_dim: int. The per-head size.
            dtype: str. The layer's compute dtype.
            **options: dict. The mechanism's call options (`call_options`),
                for caches whose shape depends on one (linear's feature map).
        """

    @abc.abstractmethod
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
        **arguments,
    ):
        """New positions attend over the cached ones and themselves.

        Args:
            query: tensor of shape `(batch, T, num_heads, head_dim)`. The
                new positions' query projections.
            key: tensor of shape `(batch, T, num_heads, head_dim)`. The new
                positions' key projections.
            value: tensor of shape `(batch, T, num_heads, head_dim)`. The
                new positions' value projections.
            cache: tuple of tensors. From `initial_cache` or a previous call
                (use the returned one: a cache may be updated in place, see
                `backend_support.write_rows`).
            cache_update_index: int or int32 scalar tensor. `t0`, the first
                new position.
            attention_mask: bool tensor or None. Of shape `(batch or 1, 1,
                T or 1, positions)` over absolute positions (at least
                `t0 + T` of them), `True` where a position holds a real token
                (the outputs at padding positions are unspecified).
            is_causal: bool. New query `i` sees positions `≤ t0 + i`.
            dropout_rate: float. As for the mechanism.
            training: bool. As for the mechanism.
            seed_generator: `keras.random.SeedGenerator` or None. As for the
                mechanism.
            **arguments: dict. The mechanism's call options and weights, as
                the layer passes them to the mechanism.

        Returns:
            `(output (batch, T, num_heads, head_dim), new_cache)`.
        """

    def resized(self, cache, max_length):
        """The cache with room for positions `[0, max_length)` only: the
        positions it holds below `max_length` kept, later ones dropped, new
        slots empty. Only a cache whose `resizable` is true can (a
        decoding loop grows it with the positions written, see
        `generation.cache_growth`)."""
        raise NotImplementedError(f"{type(self).__name__} cannot change its size.")


class KeyValueCache(DecodingCache):
    """Incremental decoding with a key/value cache (position-addressed).

    The cache holds the keys and values of every position, `K` and `V`
    `(batch, max_length, num_heads, head_dim)` each. A call writes the new
    positions' keys and values at `t0 = cache_update_index` and lets the
    new queries, at absolute positions `t0 … t0 + T − 1`, attend over the
    whole cache:

        K[:, t0 : t0 + T] ← K_new,   V[:, t0 : t0 + T] ← V_new
        output = attend(Q_new, K, V, mask = attention_mask ∧ [j ≤ t0 + i], query_offset = t0)

    (the causal part only with `is_causal`). Positions not yet written are
    zeros, kept out by the causal mask. Memory per layer grows with
    `max_length`; time per new token with the positions attended over.

    Args:
        attend: callable. `attend(query, key_cache, value_cache, attention_mask,
            query_offset, is_causal, dropout_rate=, training=,
            seed_generator=, **arguments)`, the attention of queries at
            absolute positions `query_offset …` over the whole cache, under
            `attention_mask` (causality already in it; `is_causal` tells a
            mechanism with a positional pattern which pattern to use).
            `attend_over_cache(mechanism)` makes one for a mechanism that
            takes any boolean mask and no positions (softmax, additive).

    Example:

    >>> import numpy as np
    >>> from attention_zoo_keras.attention.softmax import softmax_attention
    >>> decoding = KeyValueCache(attend_over_cache(softmax_attention))
    >>> cache = decoding.initial_cache(1, 6, num_heads=2, head_dim=4, dtype="float32")
    >>> x = np.random.rand(1, 1, 2, 4).astype("float32")
    >>> out, (key_cache, value_cache) = decoding.attend_with_cache(x, x, x, cache, 0)
    >>> tuple(out.shape), tuple(key_cache.shape)
    ((1, 1, 2, 4), (1, 6, 2, 4))
    """

    position_addressed = True
    resizable = True

    def __init__(self, attend):
        self.attend = attend

    def initial_cache(self, batch, max_length, num_heads, head_dim, dtype, **options):
        """Zero `(key_cache, value_cache)`, each `(batch, max_length,
        num_heads, head_dim)` in `dtype`; the options do not change it."""
        del options
        shape = (batch, max_length, num_heads, head_dim)
        return ops.zeros(shape, dtype=dtype), ops.zeros(shape, dtype=dtype)

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
        **arguments,
    ):
        """Writes the new keys and values, then attends over the cache; see
        `DecodingCache.attend_with_cache`."""
        key_cache, value_cache = cache
        key_cache = backend_support.write_rows(key_cache, cache_update_index, ops.cast(key, key_cache.dtype))
        value_cache = backend_support.write_rows(value_cache, cache_update_index, ops.cast(value, value_cache.dtype))
        mask = None if attention_mask is None else ops.cast(attention_mask, "bool")
        if is_causal:
            query_length, max_length = ops.shape(query)[1], ops.shape(key_cache)[1]
            causal = causal_mask(query_length, max_length, offset=cache_update_index)[None, None, :, :]
            mask = causal if mask is None else ops.logical_and(mask, causal)
        output = self.attend(
            query,
            key_cache,
            value_cache,
            mask,
            cache_update_index,
            is_causal,
            dropout_rate=dropout_rate,
            training=training,
            seed_generator=seed_generator,
            **arguments,
        )
        return output, (key_cache, value_cache)

    def resized(self, cache, max_length):
        """`K[:, :max_length]` and `V[:, :max_length]`, zeros appended where
        `max_length` is longer (see `DecodingCache.resized`)."""
        length = ops.shape(cache[0])[1]
        if max_length == length:
            return cache
        if max_length < length:
            return tuple(backend_support.materialize(tensor[:, :max_length]) for tensor in cache)
        widths = [[0, 0], [0, max_length - length], [0, 0], [0, 0]]
        return tuple(ops.pad(tensor, widths) for tensor in cache)


def attend_over_cache(mechanism):
    """The `attend` of a `KeyValueCache` for a mechanism that takes any
    boolean (query, key) mask and needs no positions: the mechanism itself,
    its causality carried by the mask."""

    def attend(query, key_cache, value_cache, attention_mask, query_offset, is_causal, **arguments):
        del query_offset, is_causal  # in the mask
        return mechanism(query, key_cache, value_cache, attention_mask=attention_mask, is_causal=False, **arguments)

    return attend
