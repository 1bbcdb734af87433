"""Additive attention — Bahdanau, Cho and Bengio, 2015, "Neural Machine
Translation by Jointly Learning to Align and Translate" (ICLR 2015),
§3.1 and appendix A.1.2:

    e_ij  = vᵀ tanh(W_q q_i + W_k k_j)
    α_ij  = softmax_j(e_ij + M_ij)
    out_i = Σ_j α_ij v_j

per head, where `M` is 0 where query i may attend to key j and −∞ where it
may not (padding, the future under a causal mask). The score is a one-hidden-
layer network with `units` tanh units instead of a dot product, so queries
and keys may differ in meaning and there is no 1/√d scale. (The paper
scores a decoder state s_{i−1} against encoder annotations h_j with
v_aᵀ tanh(W_a s_{i−1} + U_a h_j); here W_q = W_a and W_k = U_a act on each
head's query and key.)

Kept simple for teaching: the hidden layer is evaluated for every (query,
key) pair, a `(batch, query_length, key_length, heads, units)` tensor, so
memory is O(L²·units) per batch and head — `units` times that of softmax
attention's logits. Fine for short sequences; use `softmax` for long ones.

Weights (created by the layer, passed by name):

* `query_kernel` — W_q, `(num_heads, head_dim, units)`;
* `key_kernel` — W_k, `(num_heads, head_dim, units)`;
* `score_vector` — v, `(num_heads, units)`.

The paper initialises W_a and U_a from N(0, 0.001²) and v_a to zeros
(appendix B.1; attention starts uniform and v gets a gradient at once);
`additive_attention_weights` uses Glorot-uniform kernels (per head) and a
zero score vector.

Dropout, if training, drops the attention probabilities (inverted dropout,
`keras.random.dropout` with the given seed generator).
"""

import keras
from keras import ops
from keras import random

from attention_zoo_keras.attention.decoding import KeyValueCache
from attention_zoo_keras.attention.decoding import attend_over_cache
from attention_zoo_keras.attention.masks import causal_mask
from attention_zoo_keras.attention.masks import masked_logit
from attention_zoo_keras.attention.masks import softmax_last_axis
from attention_zoo_keras.attention.registry import register_decoding
from attention_zoo_keras.attention.registry import register_mechanism


def additive_attention_weights(num_heads, head_dim, units=None):
    """The weights `additive_attention` takes, as `{argument name: (shape, initializer)}`.

    A layer creates one variable per entry and passes it under that name.

    Args:
        num_heads: int. The layer's number of heads.
        head_dim: int. The per-head size.
        units: int or None. Hidden units of the score network; `None`:
            `head_dim`.

    Example:

    >>> additive_attention_weights(num_heads=4, head_dim=16, units=32)["query_kernel"][0]
    (4, 16, 32)
    """
    # Glorot-uniform for each head's (head_dim, units) matrix: Keras counts the
    # leading heads axis of a 3-D kernel as a receptive field (fans × num_heads),
    # which `scale=num_heads` undoes: limit √(6 / (head_dim + units)).
    units = head_dim if units is None else units

    def per_head_glorot():
        return keras.initializers.VarianceScaling(scale=num_heads, mode="fan_avg", distribution="uniform")

    return {
        "query_kernel": ((num_heads, head_dim, units), per_head_glorot()),
        "key_kernel": ((num_heads, head_dim, units), per_head_glorot()),
        "score_vector": ((num_heads, units), keras.initializers.Zeros()),
    }


def _check_weights(query, key, query_kernel, key_kernel, score_vector):
    if query_kernel is None or key_kernel is None or score_vector is None:
        raise ValueError(
            "additive attention needs query_kernel and key_kernel (num_heads, head_dim, units) "
            "and score_vector (num_heads, units); see additive_attention_weights()."
        )
    num_heads = query.shape[2]
    ranks = (("query_kernel", query_kernel, 3), ("key_kernel", key_kernel, 3), ("score_vector", score_vector, 2))
    for name, weight, rank in ranks:
        if len(weight.shape) != rank:
            raise ValueError(f"{name} must have rank {rank}; got shape {tuple(weight.shape)}.")
        if num_heads is not None and weight.shape[0] is not None and weight.shape[0] != num_heads:
            raise ValueError(f"{name} has {weight.shape[0]} heads, the query has {num_heads}.")
    for name, weight, inputs, input_name in (
        ("query_kernel", query_kernel, query, "query"),
        ("key_kernel", key_kernel, key, "key"),
    ):
        if weight.shape[1] is not None and inputs.shape[3] is not None and weight.shape[1] != inputs.shape[3]:
            raise ValueError(f"{name} expects head_dim {weight.shape[1]}, the {input_name} has {inputs.shape[3]}.")
    if not (query_kernel.shape[2] == key_kernel.shape[2] == score_vector.shape[1]):
        raise ValueError(
            "query_kernel, key_kernel and score_vector must agree on units; got "
            f"{query_kernel.shape[2]}, {key_kernel.shape[2]} and {score_vector.shape[1]}."
        )


@register_mechanism("additive", weights=additive_attention_weights)
def additive_attention(
    query,
    key,
    value,
    attention_mask=None,
    is_causal=False,
    dropout_rate=0.0,
    training=False,
    seed_generator=None,
    query_kernel=None,
    key_kernel=None,
    score_vector=None,
):
    """Bahdanau additive attention over `(batch, length, num_heads, head_dim)` tensors.

    Args:
        query: tensor of shape `(B, T, N, H)`. The queries.
        key: tensor of shape `(B, S, N, H)`. The keys.
        value: tensor of shape `(B, S, N, H_v)`. The values.
        attention_mask: bool tensor or None. Broadcastable to `(B, N, T, S)`;
            `True` attends.
        is_causal: bool. Also forbid attending to later positions (the last
            query aligned with the last key, as `causal_mask`).
        dropout_rate: float. Dropout on the attention probabilities while
            training.
        training: bool. Whether dropout is active.
        seed_generator: `keras.random.SeedGenerator` or None. The dropout's
            seed generator.
        query_kernel: tensor of shape `(N, H, units)`. W_q.
        key_kernel: tensor of shape `(N, H, units)`. W_k.
        score_vector: tensor of shape `(N, units)`. v.

    Returns:
        `(B, T, N, H_v)`.

    Example:

    >>> import numpy as np
    >>> q = np.random.rand(2, 5, 4, 8).astype("float32")
    >>> w = np.random.rand(4, 8, 16).astype("float32")
    >>> v = np.random.rand(4, 16).astype("float32")
    >>> tuple(additive_attention(q, q, q, query_kernel=w, key_kernel=w, score_vector=v).shape)
    (2, 5, 4, 8)
    """
    query = ops.convert_to_tensor(query)
    key = ops.convert_to_tensor(key, dtype=query.dtype)
    value = ops.convert_to_tensor(value, dtype=query.dtype)
    if query_kernel is not None:
        query_kernel = ops.convert_to_tensor(query_kernel, dtype=query.dtype)
    if key_kernel is not None:
        key_kernel = ops.convert_to_tensor(key_kernel, dtype=query.dtype)
    if score_vector is not None:
        score_vector = ops.convert_to_tensor(score_vector, dtype=query.dtype)
    _check_weights(query, key, query_kernel, key_kernel, score_vector)

    projected_query = ops.einsum("btnh,nhu->btnu", query, query_kernel)  # W_q q_i
    projected_key = ops.einsum("bsnh,nhu->bsnu", key, key_kernel)  # W_k k_j
    # tanh(W_q q_i + W_k k_j) for every pair: (B, T, S, N, units).
    hidden = ops.tanh(projected_query[:, :, None, :, :] + projected_key[:, None, :, :, :])
    logits = ops.einsum("btsnu,nu->bnts", hidden, score_vector)  # e_ij = vᵀ tanh(…)

    mask = None if attention_mask is None else ops.cast(attention_mask, "bool")
    if is_causal:
        query_length, key_length = query.shape[1], key.shape[1]
        if query_length is None:
            query_length = ops.shape(query)[1]
        if key_length is None:
            key_length = ops.shape(key)[1]
        causal = causal_mask(query_length, key_length)
        mask = causal if mask is None else ops.logical_and(mask, causal)
    if mask is not None:
        logits = ops.where(mask, logits, masked_logit(logits.dtype))
    probabilities = softmax_last_axis(logits)
    if training and dropout_rate > 0.0:
        probabilities = random.dropout(probabilities, dropout_rate, seed=seed_generator)
    return ops.einsum("bnts,bsnh->btnh", probabilities, value)


register_decoding("additive", KeyValueCache(attend_over_cache(additive_attention)))
