"""The attention probabilities of any mechanism, read off its own computation.

Every mechanism here mixes the values with weights computed from the
queries and keys,

    output_t = Σ_s P_ts v_s   (+ terms acting on the values alone),

so given one-hot values `v_s = e_s` (one per key position) the output row
is the row of weights itself: `output_t = Σ_s P_ts e_s = P_t`. The
probabilities therefore come from the mechanism's own code (its mask,
options, kernel and numerics), with nothing reimplemented per mechanism:
what is read is what the model used. For LSH attention `P` is the
combination of the hash rounds (`P = Σ_r w_r P_r`, each round's weight
`w_r` the share of its softmax normaliser), or with `hash_rounds=True` each
round's own `P_r`; for linear attention the normalised kernel weights
`φ(q_t)·φ(k_s) / φ(q_t)·Σ_j φ(k_j)`.
"""

from keras import ops

from attention_zoo_keras.attention.registry import get_mechanism
from attention_zoo_keras.attention.registry import mechanism_hashes_in_rounds
from attention_zoo_keras.attention.registry import mechanism_value_arguments


def attention_probabilities(mechanism, query, key, hash_rounds=False, **arguments):
    """The weights with which mechanism `mechanism` mixes the values.

    Args:
        mechanism: str. A registered mechanism name
            (`attention.mechanism_names()`).
        query: tensor of shape `(B, T, N, H)`. The queries.
        key: tensor of shape `(B, S, N, H)`. The keys.
        hash_rounds: bool. For a mechanism that combines hashing rounds
            (LSH), each round's weights instead of their combination.
        **arguments: dict. What the mechanism takes besides the value (the mask,
            `is_causal`, options, weights and the seed generator of its
            random draws), as the layer passes them; dropout is not applied.

    Returns:
        `(B, N, T, S)`: row `[b, n, t]` the weights of query `t` over the
        keys (0 for a key it may not attend to); with `hash_rounds` and a
        hashing mechanism, `(B, N, rounds, T, S)`.

    Example:

    >>> import numpy as np
    >>> q = np.random.rand(1, 4, 2, 8).astype("float32")
    >>> weights = attention_probabilities("softmax", q, q, is_causal=True)
    >>> np.allclose(np.asarray(weights).sum(-1), 1.0, atol=1e-5)
    True
    """
    batch, key_length, num_heads = ops.shape(key)[0], ops.shape(key)[1], ops.shape(key)[2]
    one_hot_values = ops.tile(ops.eye(key_length, dtype=query.dtype)[None, :, None, :], (batch, 1, num_heads, 1))
    ignored = set(mechanism_value_arguments(mechanism)) | {"dropout_rate", "training"}
    arguments = {name: value for name, value in arguments.items() if name not in ignored}
    if hash_rounds and mechanism_hashes_in_rounds(mechanism):
        rounds = get_mechanism(mechanism)(query, key, one_hot_values, separate_rounds=True, **arguments)
        batch, length = ops.shape(rounds)[0], ops.shape(rounds)[1]
        rounds = ops.reshape(rounds, (batch, length, num_heads, -1, key_length))  # (B, T, N, rounds, S)
        return ops.transpose(rounds, (0, 2, 3, 1, 4))
    weights = get_mechanism(mechanism)(query, key, one_hot_values, **arguments)  # (B, T, N, S)
    return ops.transpose(weights, (0, 2, 1, 3))
