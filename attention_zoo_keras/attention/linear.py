"""Linear attention — Katharopoulos, Vyas, Pappas and Fleuret, 2020,
"Transformers are RNNs: Fast Autoregressive Transformers with Linear
Attention" (ICML 2020), eqs. 4–6, 8–12 and 16–20.

Softmax's similarity exp(qᵀk/√d) becomes a kernel φ(q)ᵀφ(k) with a positive
feature map (eq. 7: φ(x) = elu(x) + 1), so the sums over keys are shared by
every query:

    V'_i = φ(Q_i)ᵀ S / (φ(Q_i)ᵀ z + eps),   S = Σ_j φ(K_j) V_jᵀ,   z = Σ_j φ(K_j)

in O(L·d²) time instead of O(L²). Under a causal mask the sums run over
j ≤ i — S_i = S_{i−1} + φ(K_i)V_iᵀ, z_i = z_{i−1} + φ(K_i) — so the model is
an RNN whose state (S, z) decodes one token at a time in constant memory
(`linear_attention_step`). As in the authors' `fast-transformers`: no 1/√d,
`eps` once in the denominator, key-padding masks only.

`docs/attention/linear.md` holds the whole description: the chunked causal
form, masks, dropout, precision, decoding and feature maps.
"""

import keras
from keras import ops

from attention_zoo_keras.attention.blocks import axis_size
from attention_zoo_keras.attention.decoding import DecodingCache
from attention_zoo_keras.attention.registry import register_decoding
from attention_zoo_keras.attention.registry import register_mechanism
from attention_zoo_keras.naming import NameRegistry

DEFAULT_EPS = 1e-6
DEFAULT_CHUNK_SIZE = 64
DEFAULT_FEATURE_MAP = "elu_plus_one"

# --- feature maps ---------------------------------------------------------

_FEATURE_MAPS = NameRegistry("linear-attention feature map", "feature maps")


def register_feature_map(name):
    """Decorator: make a feature map `φ(x)` available under `name`."""
    return _FEATURE_MAPS.register(name)


def feature_map_names():
    """Names of every registered feature map, sorted."""
    return _FEATURE_MAPS.names()


def get_feature_map(feature_map):
    """The feature map called `feature_map`, or `feature_map` itself if callable.

    Raises:
        ValueError: for an unknown name, listing the known ones.
        TypeError: for anything that is neither a name nor a callable.
    """
    if callable(feature_map):
        return feature_map
    if not isinstance(feature_map, str):
        raise TypeError(
            f"feature_map must be a name ({', '.join(feature_map_names())}) or a callable; "
            f"got {feature_map!r}."
        )
    return _FEATURE_MAPS.get(feature_map, note=" (or pass a callable)")


@register_feature_map("elu_plus_one")
def elu_plus_one(x):
    """φ(x) = elu(x) + 1, the paper's feature map (eq. 7): positive, smooth.

    Computed as `x + 1` for x > 0 and `exp(x)` otherwise (the same function):
    `elu(x) + 1 = (exp(x) − 1) + 1` would cancel to 0 in float32 below x ≈ −17
    and lose relative precision well before that.
    """
    x = ops.convert_to_tensor(x)
    one = ops.cast(1.0, x.dtype)
    return ops.where(x > 0, x + one, ops.exp(ops.minimum(x, ops.zeros((), x.dtype))))


@register_feature_map("relu")
def relu_feature_map(x):
    """φ(x) = max(x, 0). A query or key with no positive entry gets a zero
    denominator; `eps` then keeps its output finite (it is 0)."""
    return ops.relu(x)


# --- helpers --------------------------------------------------------------


def _compute_dtype(*tensors):
    """float64 if any input is float64, else float32 (also for half precision)."""
    dtypes = {keras.backend.standardize_dtype(t.dtype) for t in tensors}
    return "float64" if "float64" in dtypes else "float32"


def _key_padding(attention_mask):
    """A key-padding mask broadcastable to `(batch, heads, 1, keys)` as a
    boolean `(batch or 1, keys, heads or 1, 1)`, laid out like the keys."""
    mask = ops.convert_to_tensor(attention_mask)
    rank = len(mask.shape)
    if rank == 0 or rank > 4:
        raise ValueError(
            "attention_mask must be broadcastable to (batch, num_heads, query_length, key_length); "
            f"got shape {tuple(mask.shape)}."
        )
    if rank >= 2 and mask.shape[-2] != 1:
        raise ValueError(
            "Linear attention supports only key-padding masks (and is_causal): the mask's "
            "query axis must have size 1, i.e. shape broadcastable to (batch, num_heads, 1, "
            f"key_length); got shape {tuple(mask.shape)}. A general (query, key) mask cannot be "
            "applied because the key/value sums are shared by all queries. For incremental "
            "decoding use the recurrent state (linear_attention_step) instead of a key/value cache."
        )
    mask = ops.cast(mask, "bool")
    while len(mask.shape) < 4:
        mask = ops.expand_dims(mask, 0)
    mask = ops.transpose(mask[:, :, 0, :], (0, 2, 1))  # (batch, keys, heads)
    return ops.expand_dims(mask, -1)


def _features(query, key, value, feature_map, attention_mask):
    """φ(Q), φ(K), V in the compute dtype, padded keys' φ(K_j) and V_j zeroed."""
    dtype = _compute_dtype(query, key, value)
    phi = get_feature_map(feature_map)
    phi_query = phi(ops.cast(query, dtype))
    phi_key = phi(ops.cast(key, dtype))
    value = ops.cast(value, dtype)
    if attention_mask is not None:
        keep = _key_padding(attention_mask)
        phi_key = ops.where(keep, phi_key, ops.zeros((), dtype))
        value = ops.where(keep, value, ops.zeros((), dtype))
    return phi_query, phi_key, value


def _normalised(numerator, denominator, eps):
    """numerator / (denominator + eps), as in the reference code."""
    return numerator / ops.expand_dims(denominator + ops.cast(eps, denominator.dtype), -1)


def check_no_attention_dropout(dropout_rate, training=True):
    """Raises `ValueError` if attention dropout would be applied (see
    `docs/attention/linear.md`: linear attention has no probabilities to drop)."""
    if dropout_rate and dropout_rate > 0.0 and training:
        raise ValueError(
            f"Linear attention has no attention probabilities to drop out (got dropout_rate="
            f"{dropout_rate} while training); Katharopoulos et al. (2020) use no attention "
            "dropout. Set the attention dropout rate to 0 for attention='linear' (e.g. "
            "attention_dropout=0.0); residual dropout is unaffected."
        )


def _check_state(state, name="state"):
    if not (isinstance(state, (tuple, list)) and len(state) == 2):
        raise ValueError(f"{name} must be a pair (S, z) from linear_attention_initial_state; got {type(state)}.")
    return state


# --- non-causal -----------------------------------------------------------


def _non_causal(phi_query, phi_key, value, eps):
    state = ops.einsum("bshd,bshm->bhdm", phi_key, value)  # S = Σ_j φ(K_j) V_jᵀ
    normaliser = ops.sum(phi_key, axis=1)  # z = Σ_j φ(K_j), (b, h, d)
    numerator = ops.einsum("bthd,bhdm->bthm", phi_query, state)
    denominator = ops.einsum("bthd,bhd->bth", phi_query, normaliser)
    return _normalised(numerator, denominator, eps)


# --- causal, chunked ------------------------------------------------------


def _causal_chunked(phi_query, phi_key, value, eps, chunk_size, initial_state=None):
    """Causal linear attention by chunks; returns `(output, final_state)`."""
    length = axis_size(phi_query)
    static = isinstance(length, int)
    chunk = max(1, min(chunk_size, length)) if static else chunk_size
    batch = ops.shape(phi_query)[0]
    num_heads, key_dim, value_dim = phi_query.shape[2], phi_query.shape[3], value.shape[3]

    if static:
        padded_length = -(-length // chunk) * chunk
    else:
        padded_length = (length + chunk - 1) // chunk * chunk
    padding = padded_length - length
    if not static or padding:
        # Zero keys and values: they add nothing to any sum.
        widths = [[0, 0], [0, padding], [0, 0], [0, 0]]
        phi_query, phi_key, value = (ops.pad(t, widths) for t in (phi_query, phi_key, value))

    def chunked(t, dim):
        return ops.reshape(t, (batch, -1, chunk, num_heads, dim))

    q = chunked(phi_query, key_dim)  # (b, n, i, h, d)
    k = chunked(phi_key, key_dim)  # (b, n, j, h, d)
    v = chunked(value, value_dim)  # (b, n, j, h, m)

    # Within a chunk: the masked quadratic form.
    lower = ops.tril(ops.ones((chunk, chunk), "bool"))
    scores = ops.einsum("bnihd,bnjhd->bnhij", q, k)
    scores = ops.where(lower, scores, ops.zeros((), scores.dtype))
    numerator = ops.einsum("bnhij,bnjhm->bnihm", scores, v)
    denominator = ops.transpose(ops.sum(scores, axis=-1), (0, 1, 3, 2))  # (b, n, i, h)

    # Across chunks: the state after all earlier chunks (exclusive cumsum).
    chunk_state = ops.einsum("bnjhd,bnjhm->bnhdm", k, v)
    chunk_normaliser = ops.sum(k, axis=2)  # (b, n, h, d)

    def exclusive_cumsum(t):
        shifted = ops.concatenate([ops.zeros_like(t[:, :1]), t[:, :-1]], axis=1)
        return ops.cumsum(shifted, axis=1)

    state_before = exclusive_cumsum(chunk_state)
    normaliser_before = exclusive_cumsum(chunk_normaliser)
    final_state = ops.sum(chunk_state, axis=1)
    final_normaliser = ops.sum(chunk_normaliser, axis=1)
    if initial_state is not None:
        state0, normaliser0 = (ops.cast(t, q.dtype) for t in _check_state(initial_state, "initial_state"))
        state_before = state_before + ops.expand_dims(state0, 1)
        normaliser_before = normaliser_before + ops.expand_dims(normaliser0, 1)
        final_state = final_state + state0
        final_normaliser = final_normaliser + normaliser0
    numerator = numerator + ops.einsum("bnihd,bnhdm->bnihm", q, state_before)
    denominator = denominator + ops.einsum("bnihd,bnhd->bnih", q, normaliser_before)

    output = _normalised(numerator, denominator, eps)
    output = ops.reshape(output, (batch, padded_length, num_heads, value_dim))[:, :length]
    return output, (final_state, final_normaliser)


def _check_lengths(query, key, value, is_causal):
    key_length, value_length = key.shape[1], value.shape[1]
    if key_length is not None and value_length is not None and key_length != value_length:
        raise ValueError(f"key and value must have the same length; got {key_length} and {value_length}.")
    query_length = query.shape[1]
    if is_causal and query_length is not None and key_length is not None and query_length != key_length:
        raise ValueError(
            "Causal linear attention needs query_length == key_length (self-attention); got "
            f"{query_length} and {key_length}. To continue after earlier positions, pass their "
            "state: causal_linear_attention(..., initial_state=state) or linear_attention_step."
        )


@register_mechanism("linear")
def linear_attention(
    query,
    key,
    value,
    attention_mask=None,
    is_causal=False,
    dropout_rate=0.0,
    training=False,
    seed_generator=None,
    feature_map=DEFAULT_FEATURE_MAP,
    eps=DEFAULT_EPS,
    chunk_size=DEFAULT_CHUNK_SIZE,
):
    """Linear attention over `(batch, length, num_heads, head_dim)` tensors.

    `V'_i = φ(Q_i)ᵀ Σ_j φ(K_j)V_jᵀ / (φ(Q_i)ᵀ Σ_j φ(K_j) + eps)`, the sums
    over all keys, or over keys `j ≤ i` with `is_causal` (computed by chunks,
    see `docs/attention/linear.md`). No 1/√d scaling.

    Args:
        query: `(B, T, N, D)`.
        key: `(B, S, N, D)`.
        value: `(B, S, N, M)`.
        attention_mask: a key-padding mask only: boolean, broadcastable to
            `(B, N, 1, S)`; `True` where a key is real. A mask with a query
            axis longer than 1 raises `ValueError`.
        is_causal: query `i` sees keys `j ≤ i`; needs `T == S`.
        dropout_rate: must be 0 when `training` (there are no attention
            probabilities to drop); see `docs/attention/linear.md`.
        training: whether the call is in training mode.
        seed_generator: unused (the mechanism calling convention).
        feature_map: a name from `feature_map_names()` or a callable.
        eps: added to the denominator, as in the reference code.
        chunk_size: chunk length of the causal form (at most the sequence
            length is used); memory O(L·chunk + (L/chunk)·D·M).

    Returns:
        `(B, T, N, M)` in the query's dtype.

    Example:

    >>> import numpy as np
    >>> q = np.random.rand(2, 5, 4, 8).astype("float32")
    >>> tuple(linear_attention(q, q, q, is_causal=True, chunk_size=2).shape)
    (2, 5, 4, 8)
    """
    del seed_generator
    check_no_attention_dropout(dropout_rate, training)
    _check_lengths(query, key, value, is_causal)
    phi_query, phi_key, value_ = _features(query, key, value, feature_map, attention_mask)
    if is_causal:
        output, _ = _causal_chunked(phi_query, phi_key, value_, eps, chunk_size)
    else:
        output = _non_causal(phi_query, phi_key, value_, eps)
    return ops.cast(output, query.dtype)


def causal_linear_attention(
    query,
    key,
    value,
    attention_mask=None,
    feature_map=DEFAULT_FEATURE_MAP,
    eps=DEFAULT_EPS,
    chunk_size=DEFAULT_CHUNK_SIZE,
    initial_state=None,
    return_state=False,
):
    """Causal linear attention that can start from, and return, the recurrent state.

    With `initial_state` the sequence continues after earlier positions whose
    keys and values the state summarises; `return_state=True` also returns the
    state after the last position. This is the prompt pass ("prefill") of
    constant-memory generation: `causal_linear_attention(prompt...,
    return_state=True)`, then `linear_attention_step` per new token.

    Args:
        query: `(B, L, N, D)`.
        key: `(B, L, N, D)`.
        value: `(B, L, N, M)`.
        attention_mask: optional key-padding mask broadcastable to
            `(B, N, 1, L)`; padded positions are left out of the state.
        feature_map: as in `linear_attention`.
        eps: as in `linear_attention`.
        chunk_size: as in `linear_attention`.
        initial_state: optional `(S, z)`, `(B, N, D', M)` and `(B, N, D')`
            (D' = the feature map's output size, D for elementwise maps).
        return_state: also return the final state.

    Returns:
        `(B, L, N, M)` in the query's dtype, or `(output, (S, z))` with the
        state in float32 (float64 for float64 inputs).
    """
    _check_lengths(query, key, value, is_causal=True)
    phi_query, phi_key, value_ = _features(query, key, value, feature_map, attention_mask)
    output, state = _causal_chunked(phi_query, phi_key, value_, eps, chunk_size, initial_state)
    output = ops.cast(output, query.dtype)
    return (output, state) if return_state else output


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
        query: `(B, 1, N, D)`.
        key: `(B, 1, N, D)`.
        value: `(B, 1, N, M)`.
        state: `(S, z)` from `linear_attention_initial_state`, a previous step
            or `causal_linear_attention(..., return_state=True)`.
        feature_map: as in `linear_attention`.
        eps: as in `linear_attention`.
        key_mask: optional boolean `(B,)` or `(B, 1)`: `False` for rows whose
            new position is padding; their state is left unchanged.

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
    state_matrix, normaliser = _check_state(state)
    state_dtype = keras.backend.standardize_dtype(state_matrix.dtype)
    dtype = _compute_dtype(query, key, value, state_matrix)
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
    output = ops.expand_dims(_normalised(numerator, denominator, eps), 1)
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
            step_mask = None if key_mask is None else _key_padding(key_mask)[:, 0, 0, 0]
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
