"""Incremental decoding for linear attention (`linear.py`; Katharopoulos,
Vyas, Pappas and Fleuret, 2020, "Transformers are RNNs", eqs. 18–20): the
causal form as an RNN whose state `(S, z)` takes one position at a time,

    S ← S + φ(K)Vᵀ,  z ← z + φ(K),  V' = φ(Q)ᵀS / (φ(Q)ᵀz + eps)

in constant memory and time per token, and the decoding cache
(`RecurrentState`) that makes the state a layer's cache.
"""

import keras
from keras import ops

from attention_zoo_keras.attention.blocks import axis_size
from attention_zoo_keras.attention.decoding import DecodingCache
from attention_zoo_keras.attention.linear import DEFAULT_CHUNK_SIZE
from attention_zoo_keras.attention.linear import DEFAULT_EPS
from attention_zoo_keras.attention.linear import DEFAULT_FEATURE_MAP
from attention_zoo_keras.attention.linear import causal_linear_attention
from attention_zoo_keras.attention.linear import check_no_attention_dropout
from attention_zoo_keras.attention.linear import check_state
from attention_zoo_keras.attention.linear import compute_dtype
from attention_zoo_keras.attention.linear import get_feature_map
from attention_zoo_keras.attention.linear import key_padding_mask
from attention_zoo_keras.attention.linear import normalised
from attention_zoo_keras.attention.registry import register_decoding

# --- recurrent form -------------------------------------------------------


def linear_attention_initial_state(batch, num_heads, key_dim, value_dim, dtype="float32"):
    """The empty state `(S, z)`: zeros `(batch, num_heads, key_dim, value_dim)`
    and `(batch, num_heads, key_dim)`. `key_dim` is the feature map's output
    size (the head size for elementwise maps). Keep it float32 for
    half-precision models: the state accumulates over the whole sequence."""
    return (
        ops.zeros((batch, num_heads, key_dim, value_dim), dtype),
        ops.zeros((batch, num_heads, key_dim), dtype),
    )


def linear_attention_step(
    query,
    key,
    value,
    state,
    feature_map=DEFAULT_FEATURE_MAP,
    eps=DEFAULT_EPS,
    key_mask=None,
):
    """One position of causal linear attention as an RNN (the paper's eqs. 18–20).

        S ← S + φ(K)Vᵀ,  z ← z + φ(K),  V' = φ(Q)ᵀS / (φ(Q)ᵀz + eps)

    Memory and time per step are independent of how many positions came
    before. Gives the same outputs as the causal form, position by position.

    Args:
        query: tensor of shape `(B, 1, N, D)`. The new position's query.
        key: tensor of shape `(B, 1, N, D)`. The new position's key.
        value: tensor of shape `(B, 1, N, M)`. The new position's value.
        state: tuple of two tensors. `(S, z)` from
            `linear_attention_initial_state`, a previous step or
            `causal_linear_attention(..., return_state=True)`.
        feature_map: str or callable. As in `linear_attention`.
        eps: float. As in `linear_attention`.
        key_mask: bool tensor of shape `(B,)` or `(B, 1)`, or None. `False`
            for rows whose new position is padding; their state is left
            unchanged.

    Returns:
        `(output, new_state)`: output `(B, 1, N, M)` in the query's dtype,
        the new state in the dtype of `state`.

    Example:

    >>> import numpy as np
    >>> state = linear_attention_initial_state(2, 4, 8, 8)
    >>> x = np.random.rand(2, 1, 4, 8).astype("float32")
    >>> out, state = linear_attention_step(x, x, x, state)
    >>> tuple(out.shape), tuple(state[0].shape)
    ((2, 1, 4, 8), (2, 4, 8, 8))
    """
    for name, tensor in (("query", query), ("key", key), ("value", value)):
        if tensor.shape[1] is not None and tensor.shape[1] != 1:
            raise ValueError(
                f"linear_attention_step takes one position: {name} must be (batch, 1, heads, dim); got "
                f"{tuple(tensor.shape)}. For several positions use causal_linear_attention(..., "
                "initial_state=state, return_state=True)."
            )
    state_matrix, normaliser = check_state(state)
    state_dtype = keras.backend.standardize_dtype(state_matrix.dtype)
    dtype = compute_dtype(query, key, value, state_matrix)
    phi = get_feature_map(feature_map)
    phi_query = phi(ops.cast(query[:, 0], dtype))  # (b, h, d)
    phi_key = phi(ops.cast(key[:, 0], dtype))
    value_ = ops.cast(value[:, 0], dtype)  # (b, h, m)
    if key_mask is not None:
        keep = ops.reshape(ops.cast(key_mask, "bool"), (-1, 1, 1))
        phi_key = ops.where(keep, phi_key, ops.zeros((), dtype))
        value_ = ops.where(keep, value_, ops.zeros((), dtype))
    state_matrix = ops.cast(state_matrix, dtype) + ops.einsum("bhd,bhm->bhdm", phi_key, value_)
    normaliser = ops.cast(normaliser, dtype) + phi_key
    numerator = ops.einsum("bhd,bhdm->bhm", phi_query, state_matrix)
    denominator = ops.einsum("bhd,bhd->bh", phi_query, normaliser)
    output = ops.expand_dims(normalised(numerator, denominator, eps), 1)
    new_state = (ops.cast(state_matrix, state_dtype), ops.cast(normaliser, state_dtype))
    return ops.cast(output, query.dtype), new_state


# --- decoding cache -------------------------------------------------------


class RecurrentState(DecodingCache):
    """Incremental decoding with the recurrent state `(S, z)` (not
    position-addressed): constant memory and time per new token.

    The cache summarises every position fed so far,
    `S = Σ_j φ(K_j)V_jᵀ` `(batch, num_heads, D', head_dim)` and
    `z = Σ_j φ(K_j)` `(batch, num_heads, D')` (D' = the feature map's output
    size), in float32 (float64 for float64 models) whatever the compute
    dtype. A call with `T` new positions continues the causal sums:

        T = 1:  linear_attention_step(Q, K, V, (S, z))
        T > 1:  causal_linear_attention(Q, K, V, initial_state=(S, z), return_state=True)

    A state cannot be rewritten: feed every position exactly once, in order
    (`cache_update_index` says where the new positions start; it only
    selects their columns of `attention_mask`). Only causal self-attention
    and key-padding masks are supported; a masked-out new position is left
    out of the state.

    The options `feature_map`, `eps` and `chunk_size` (as in
    `linear_attention`) come with each call, as the layer passes them to the
    mechanism; `initial_cache` needs the feature map for the state's size.

    Example:

    >>> import numpy as np
    >>> decoding = RecurrentState()
    >>> cache = decoding.initial_cache(1, 4096, num_heads=2, head_dim=4, dtype="bfloat16")
    >>> x = np.random.rand(1, 5, 2, 4).astype("float32")
    >>> out, cache = decoding.attend_with_cache(x, x, x, cache, 0)       # prefill
    >>> out, cache = decoding.attend_with_cache(x[:, :1], x[:, :1], x[:, :1], cache, 5)  # one token
    >>> import keras
    >>> tuple(cache[0].shape), keras.backend.standardize_dtype(cache[0].dtype)
    ((1, 2, 4, 4), 'float32')
    """

    position_addressed = False

    def initial_cache(self, batch, max_length, num_heads, head_dim, dtype, feature_map=DEFAULT_FEATURE_MAP, **options):
        """The empty state `(S, z)`; `max_length` is not needed (the state
        does not grow with the sequence)."""
        del max_length, options
        key_dim = get_feature_map(feature_map)(ops.zeros((1, head_dim), "float32")).shape[-1]
        state_dtype = "float64" if keras.backend.standardize_dtype(dtype) == "float64" else "float32"
        return linear_attention_initial_state(batch, num_heads, key_dim, head_dim, state_dtype)

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
        feature_map=DEFAULT_FEATURE_MAP,
        eps=DEFAULT_EPS,
        chunk_size=DEFAULT_CHUNK_SIZE,
    ):
        """Continues the causal sums over the new positions; see
        `DecodingCache.attend_with_cache`."""
        del seed_generator
        check_no_attention_dropout(dropout_rate, training)
        if not is_causal:
            raise ValueError(
                "The recurrent state of linear attention decodes causal self-attention only "
                "(is_causal=True): a position's output cannot depend on later positions that "
                "have not been fed yet."
            )
        length = query.shape[1]
        key_mask = None
        if attention_mask is not None:
            key_mask = _new_positions(attention_mask, cache_update_index, axis_size(query))
        if length == 1:
            step_mask = None if key_mask is None else key_padding_mask(key_mask)[:, 0, 0, 0]
            output, state = linear_attention_step(
                query, key, value, cache, feature_map=feature_map, eps=eps, key_mask=step_mask
            )
        else:
            output, state = causal_linear_attention(
                query, key, value, attention_mask=key_mask, feature_map=feature_map, eps=eps,
                chunk_size=chunk_size, initial_state=cache, return_state=True,
            )
        return output, tuple(ops.cast(new, old.dtype) for new, old in zip(state, cache))


def _new_positions(attention_mask, start, length):
    """The columns `start … start + length − 1` of a mask over absolute
    positions, `(batch or 1, heads or 1, query_length or 1, positions)`."""
    mask = ops.convert_to_tensor(attention_mask)
    if len(mask.shape) != 4:
        raise ValueError(
            "With a decoding cache, attention_mask must be (batch or 1, num_heads or 1, "
            f"query_length or 1, positions); got shape {tuple(mask.shape)}."
        )
    shape = ops.shape(mask)
    return ops.slice(mask, (0, 0, 0, start), (shape[0], shape[1], shape[2], length))


register_decoding("linear", RecurrentState())
