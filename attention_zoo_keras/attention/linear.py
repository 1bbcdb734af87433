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
(`linear_decoding.py`). As in the authors' `fast-transformers`: no 1/√d,
`eps` once in the denominator, key-padding masks only.

`docs/attention/linear.md` holds the whole description: the chunked causal
form, masks, dropout, precision, decoding and feature maps.
"""

import keras
from keras import ops

from attention_zoo_keras.attention.blocks import axis_size
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


# --- helpers (shared with the recurrent form, `linear_decoding.py`) --------


def compute_dtype(*tensors):
    """The dtype linear attention computes in: float64 if any input is
    float64, else float32 (also for half precision).

    Args:
        *tensors: tensor. The inputs (query, key, value, a state).
    """
    dtypes = {keras.backend.standardize_dtype(t.dtype) for t in tensors}
    return "float64" if "float64" in dtypes else "float32"


def key_padding_mask(attention_mask):
    """A key-padding mask laid out like the keys: boolean `(batch or 1,
    keys, heads or 1, 1)`.

    Args:
        attention_mask: tensor. Broadcastable to `(batch, heads, 1, keys)`.

    Raises:
        ValueError: for a mask with a query axis longer than 1 (linear
            attention shares its key/value sums among all queries).
    """
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
    dtype = compute_dtype(query, key, value)
    phi = get_feature_map(feature_map)
    phi_query = phi(ops.cast(query, dtype))
    phi_key = phi(ops.cast(key, dtype))
    value = ops.cast(value, dtype)
    if attention_mask is not None:
        keep = key_padding_mask(attention_mask)
        phi_key = ops.where(keep, phi_key, ops.zeros((), dtype))
        value = ops.where(keep, value, ops.zeros((), dtype))
    return phi_query, phi_key, value


def normalised(numerator, denominator, eps):
    """`numerator / (denominator + eps)`, as in the reference code.

    Args:
        numerator: tensor. `φ(Q)ᵀS`, `(..., M)`.
        denominator: tensor. `φ(Q)ᵀz`, `(...)`.
        eps: float. Added to the denominator.
    """
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


def check_state(state, name="state"):
    """`state` if it is a pair `(S, z)`; raises `ValueError` otherwise.

    Args:
        state: tuple. The recurrent state `(S, z)`.
        name: str. The argument's name, for the message.
    """
    if not (isinstance(state, (tuple, list)) and len(state) == 2):
        raise ValueError(f"{name} must be a pair (S, z) from linear_attention_initial_state; got {type(state)}.")
    return state


# --- non-causal -----------------------------------------------------------


def _non_causal(phi_query, phi_key, value, eps):
    state = ops.einsum("bshd,bshm->bhdm", phi_key, value)  # S = Σ_j φ(K_j) V_jᵀ
    normaliser = ops.sum(phi_key, axis=1)  # z = Σ_j φ(K_j), (b, h, d)
    numerator = ops.einsum("bthd,bhdm->bthm", phi_query, state)
    denominator = ops.einsum("bthd,bhd->bth", phi_query, normaliser)
    return normalised(numerator, denominator, eps)


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
        state0, normaliser0 = (ops.cast(t, q.dtype) for t in check_state(initial_state, "initial_state"))
        state_before = state_before + ops.expand_dims(state0, 1)
        normaliser_before = normaliser_before + ops.expand_dims(normaliser0, 1)
        final_state = final_state + state0
        final_normaliser = final_normaliser + normaliser0
    numerator = numerator + ops.einsum("bnihd,bnhdm->bnihm", q, state_before)
    denominator = denominator + ops.einsum("bnihd,bnhd->bnih", q, normaliser_before)

    output = normalised(numerator, denominator, eps)
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
        query: tensor of shape `(B, T, N, D)`. The queries.
        key: tensor of shape `(B, S, N, D)`. The keys.
        value: tensor of shape `(B, S, N, M)`. The values.
        attention_mask: bool tensor or None. A key-padding mask only,
            broadcastable to `(B, N, 1, S)`; `True` where a key is real. A
            mask with a query axis longer than 1 raises `ValueError`.
        is_causal: bool. Query `i` sees keys `j ≤ i`; needs `T == S`.
        dropout_rate: float. Must be 0 when `training` (there are no
            attention probabilities to drop); see `docs/attention/linear.md`.
        training: bool. Whether the call is in training mode.
        seed_generator: `keras.random.SeedGenerator` or None. Unused (the
            mechanism calling convention).
        feature_map: str or callable. A name from `feature_map_names()` or a
            callable.
        eps: float. Added to the denominator, as in the reference code.
        chunk_size: int. Chunk length of the causal form (at most the
            sequence length is used); memory O(L·chunk + (L/chunk)·D·M).

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
        query: tensor of shape `(B, L, N, D)`. The queries.
        key: tensor of shape `(B, L, N, D)`. The keys.
        value: tensor of shape `(B, L, N, M)`. The values.
        attention_mask: bool tensor or None. A key-padding mask
            broadcastable to `(B, N, 1, L)`; padded positions are left out of
            the state.
        feature_map: str or callable. As in `linear_attention`.
        eps: float. As in `linear_attention`.
        chunk_size: int. As in `linear_attention`.
        initial_state: tuple of two tensors or None. `(S, z)`, of shapes
            `(B, N, D', M)` and `(B, N, D')` (D' = the feature map's output
            size, D for elementwise maps).
        return_state: bool. Whether to also return the final state.

    Returns:
        `(B, L, N, M)` in the query's dtype, or `(output, (S, z))` with the
        state in float32 (float64 for float64 inputs).
    """
    _check_lengths(query, key, value, is_causal=True)
    phi_query, phi_key, value_ = _features(query, key, value, feature_map, attention_mask)
    output, state = _causal_chunked(phi_query, phi_key, value_, eps, chunk_size, initial_state)
    output = ops.cast(output, query.dtype)
    return (output, state) if return_state else output
