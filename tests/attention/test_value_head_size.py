"""Every registered mechanism with a value head size `M` other than the
query/key head size `D` (more and fewer columns), causal and not: the
output is `(B, L, N, M)`, finite, and its columns are those the mechanism
gives for the same query and key with the value cut to `min(D, M)`
columns (a value column only ever enters its own output column). The
mechanisms that are softmax under a dense pattern are also checked against
a brute-force numpy computation. `keras.ops.dot_product_attention` takes
only `M = D` on JAX; softmax's fused path and its einsum path (training
with attention dropout) are both covered."""

import math

import keras
import numpy as np
import pytest

from attention_zoo_keras.attention import get_mechanism
from attention_zoo_keras.attention import registry
from attention_zoo_keras.attention.local import local_mask
from attention_zoo_keras.attention.local_2d import local_mask_2d
from attention_zoo_keras.attention.sparse import sparse_mask

BATCH, LENGTH, HEADS, HEAD_DIM = 2, 12, 2, 4
VALUE_DIMS = (7, 3)  # wider and narrower than HEAD_DIM
ATOL = 1e-5

# Options per mechanism; every registered mechanism must be listed (none
# is skipped: in each the attention weights do not depend on the values).
OPTIONS = {
    "additive": {"units": 5},
    "linear": {},
    "local": {"block_size": 5, "num_memory_blocks": 1},
    "local_2d": {"image_shape": (3, 4), "block_shape": (2, 2), "memory_flange": (1, 1)},
    "lsh": {"num_hashes": 2, "num_buckets": 4, "chunk_length": 4, "seed": 0},
    "relative": {"max_distance": 3},
    "softmax": {},
    "sparse": {"pattern": "strided", "stride": 3},
    "xl": {},
}


def _dense_pattern(name, is_causal):
    """The boolean `(L, L)` pattern of a mechanism that is softmax under
    it, or `None` for the others."""
    options = OPTIONS[name]
    if name == "softmax":
        return np.tril(np.ones((LENGTH, LENGTH), bool)) if is_causal else np.ones((LENGTH, LENGTH), bool)
    if name == "local":
        return local_mask(LENGTH, options["block_size"], options["num_memory_blocks"], is_causal)
    if name == "local_2d":
        return local_mask_2d(
            options["image_shape"], options["block_shape"], options["memory_flange"], is_causal=is_causal
        )
    if name == "sparse":
        return sparse_mask(LENGTH, options["pattern"], options["stride"], is_causal=is_causal)
    return None


def _brute_force(query, key, value, pattern):
    """softmax(q kᵀ / √D under `pattern`) v in float64 numpy."""
    logits = np.einsum("btnh,bsnh->bnts", query, key).astype("float64") / math.sqrt(query.shape[-1])
    logits = np.where(np.asarray(pattern), logits, -np.inf)
    probabilities = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probabilities /= probabilities.sum(axis=-1, keepdims=True)
    return np.einsum("bnts,bsnh->btnh", probabilities, value)


def _arguments(name, value_dim, rng):
    """Options, weights (w^V of relative attention `value_dim` wide) and
    per-call inputs of mechanism `name`."""
    options = OPTIONS[name]
    arguments = dict(registry.call_options(name, options))
    for argument, (shape, _) in registry.mechanism_weights(name, HEADS, HEAD_DIM, options).items():
        if argument == "relative_value_embeddings":
            shape = shape[:-1] + (value_dim,)
        arguments[argument] = rng.normal(0.0, 0.5, shape).astype("float32")
    if name == "xl":
        arguments["position_keys"] = rng.normal(0.0, 0.5, (LENGTH, HEADS, HEAD_DIM)).astype("float32")
    return arguments


def _numpy(x):
    return np.asarray(keras.ops.convert_to_numpy(x))


def test_every_registered_mechanism_is_covered():
    assert set(OPTIONS) == set(registry.mechanism_names())


@pytest.mark.parametrize("value_dim", VALUE_DIMS)
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_value_head_size_other_than_the_key_head_size(name, is_causal, value_dim):
    rng = np.random.default_rng(0)
    query, key = (rng.standard_normal((BATCH, LENGTH, HEADS, HEAD_DIM)).astype("float32") for _ in range(2))
    value = rng.standard_normal((BATCH, LENGTH, HEADS, value_dim)).astype("float32")
    arguments = _arguments(name, value_dim, rng)
    mechanism = get_mechanism(name)

    output = _numpy(mechanism(query, key, value, is_causal=is_causal, **arguments))
    assert output.shape == (BATCH, LENGTH, HEADS, value_dim)
    assert np.all(np.isfinite(output))

    common = min(HEAD_DIM, value_dim)
    square_value = np.zeros((BATCH, LENGTH, HEADS, HEAD_DIM), "float32")
    square_value[..., :common] = value[..., :common]
    if "relative_value_embeddings" in arguments:
        table = np.zeros(arguments["relative_value_embeddings"].shape[:-1] + (HEAD_DIM,), "float32")
        table[..., :common] = arguments["relative_value_embeddings"][..., :common]
        arguments["relative_value_embeddings"] = table
    square = _numpy(mechanism(query, key, square_value, is_causal=is_causal, **arguments))
    np.testing.assert_allclose(output[..., :common], square[..., :common], atol=ATOL)

    pattern = _dense_pattern(name, is_causal)
    if pattern is not None:
        np.testing.assert_allclose(output, _brute_force(query, key, value, pattern), atol=ATOL)


@pytest.mark.parametrize("value_dim", VALUE_DIMS)
def test_softmax_einsum_path_with_dropout(value_dim):
    """Training with attention dropout leaves the fused path (for the
    einsum path on JAX and TensorFlow, torch's kernel with dropout): the
    same dropout draw gives the same columns as the square value."""
    rng = np.random.default_rng(1)
    query, key = (rng.standard_normal((BATCH, LENGTH, HEADS, HEAD_DIM)).astype("float32") for _ in range(2))
    value = rng.standard_normal((BATCH, LENGTH, HEADS, max(value_dim, HEAD_DIM))).astype("float32")
    mechanism = get_mechanism("softmax")

    def dropped_out(v):
        keras.utils.set_random_seed(5)
        return _numpy(
            mechanism(
                query, key, v, is_causal=True, dropout_rate=0.5, training=True,
                seed_generator=keras.random.SeedGenerator(5),
            )
        )

    output = dropped_out(value[..., :value_dim])
    assert output.shape == (BATCH, LENGTH, HEADS, value_dim) and np.all(np.isfinite(output))
    common = min(HEAD_DIM, value_dim)
    np.testing.assert_allclose(output[..., :common], dropped_out(value[..., :HEAD_DIM])[..., :common], atol=ATOL)
    assert not np.allclose(output, _numpy(mechanism(query, key, value[..., :value_dim], is_causal=True)))
