"""Transformer-XL attention against its equation computed term by term in
numpy: content and position terms with the biases u and v, distances into
the memory, clamping, the `same_length` window, the relative shift against
the gather it replaces, and decoding over a key/value cache."""

import keras
import numpy as np
import pytest

from attention_zoo_keras.attention.registry import get_decoding
from attention_zoo_keras.attention.registry import mechanism_options
from attention_zoo_keras.attention.xl import relative_shift
from attention_zoo_keras.attention.xl import xl_attention
from attention_zoo_keras.attention.xl import xl_attention_mask

HEADS, HEAD_DIM = 2, 4


def _reference(query, key, value, position_keys, u, v, attention_span=None):
    """The paper's A_ij term by term: query i at position m + i, key j at j,
    distance clipped to the table's last row; causal, optionally windowed."""
    batch, length, heads, dim = query.shape
    num_keys = key.shape[1]
    memory = num_keys - length
    out = np.zeros_like(query)
    for b in range(batch):
        for n in range(heads):
            for i in range(length):
                position = memory + i
                scores = np.full(num_keys, -np.inf)
                for j in range(num_keys):
                    if j > position or (attention_span is not None and j <= position - attention_span):
                        continue
                    distance = min(position - j, len(position_keys) - 1)
                    scores[j] = ((query[b, i, n] + u[n]) @ key[b, j, n] + (query[b, i, n] + v[n]) @ position_keys[distance, n]) / np.sqrt(dim)
                weights = np.exp(scores - scores.max())
                weights /= weights.sum()
                out[b, i, n] = weights @ value[b, :, n]
    return out


def _inputs(length=3, memory=4, distances=None, seed=0):
    rng = np.random.default_rng(seed)
    num_keys = length + memory
    query = rng.normal(size=(2, length, HEADS, HEAD_DIM)).astype("float32")
    key = rng.normal(size=(2, num_keys, HEADS, HEAD_DIM)).astype("float32")
    value = rng.normal(size=(2, num_keys, HEADS, HEAD_DIM)).astype("float32")
    table = rng.normal(size=(distances or num_keys, HEADS, HEAD_DIM)).astype("float32")
    u, v = rng.normal(size=(2, HEADS, HEAD_DIM)).astype("float32")
    return query, key, value, table, u, v


def _numpy(x):
    return np.asarray(keras.ops.convert_to_numpy(x))


@pytest.mark.parametrize("memory", [0, 4])
def test_matches_the_equation_with_memory(memory):
    query, key, value, table, u, v = _inputs(memory=memory)
    got = xl_attention(query, key, value, position_keys=table, content_bias=u, position_bias=v)
    np.testing.assert_allclose(_numpy(got), _reference(query, key, value, table, u, v), atol=1e-5)


def test_same_length_window():
    query, key, value, table, u, v = _inputs(length=4, memory=3)
    mask = xl_attention_mask(4, 7, attention_span=3)[None, None]
    got = xl_attention(query, key, value, attention_mask=mask, position_keys=table, content_bias=u, position_bias=v)
    np.testing.assert_allclose(_numpy(got), _reference(query, key, value, table, u, v, attention_span=3), atol=1e-5)


def test_a_short_table_clamps_distances_through_the_gather():
    # Fewer rows than keys: longer distances share the last row (clamp_len).
    query, key, value, table, u, v = _inputs(length=3, memory=5, distances=3)
    got = xl_attention(query, key, value, position_keys=table, content_bias=u, position_bias=v)
    np.testing.assert_allclose(_numpy(got), _reference(query, key, value, table, u, v), atol=1e-5)


def test_relative_shift_places_every_distance():
    length, num_keys = 3, 5
    by_distance = np.arange(length * num_keys, dtype="float32").reshape(1, 1, length, num_keys)
    shifted = _numpy(relative_shift(by_distance))[0, 0]
    memory = num_keys - length
    for i in range(length):
        for j in range(memory + i + 1):  # later keys are garbage, masked by causality
            assert shifted[i, j] == by_distance[0, 0, i, j + length - 1 - i]


def test_decoding_over_a_key_value_cache_equals_the_full_pass():
    query, key, value, table, u, v = _inputs(length=6, memory=0)
    full = _numpy(xl_attention(query, key, value, position_keys=table, content_bias=u, position_bias=v))
    decoding = get_decoding("xl")
    cache = decoding.initial_cache(2, 8, HEADS, HEAD_DIM, "float32")
    outputs = []
    for t in range(6):
        out, cache = decoding.attend_with_cache(
            query[:, t : t + 1], key[:, t : t + 1], value[:, t : t + 1], cache, t,
            position_keys=table, content_bias=u, position_bias=v,
        )
        outputs.append(_numpy(out))
    np.testing.assert_allclose(np.concatenate(outputs, axis=1), full, atol=1e-5)


def test_missing_positions_are_a_clear_error_and_biases_are_weights_not_options():
    query, key, value, table, u, v = _inputs()
    with pytest.raises(ValueError, match="position_keys"):
        xl_attention(query, key, value)
    assert "content_bias" not in mechanism_options("xl")
    assert mechanism_options("xl") == {"per_layer_biases": True}


def test_one_key_attends_with_weight_one_and_no_warning():
    """The first token of a text scored over the authors' empty memory
    attends to one key: Keras' warning about a softmax over one entry is not
    raised for it, in the model or in a top-p sampler keeping one token."""
    import warnings

    import attention_zoo_keras as azk
    from attention_zoo_keras.attention.masks import softmax_last_axis

    backbone = azk.models.TransformerXLBackbone(
        vocabulary_size=8, num_layers=1, num_heads=2, hidden_dim=8, head_dim=4, intermediate_dim=16, mem_len=4)
    lm = azk.models.TransformerXLCausalLM(backbone)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*softmax")
        scores = lm.score(np.array([[2]]), memory=backbone.initial_memory(1, 0))
        weights = softmax_last_axis(keras.ops.convert_to_tensor(np.array([[0.5], [-3.0]], "float32")))
        azk.generation.TopPSampler(0.9, k=1).candidates(keras.ops.convert_to_tensor(np.ones((1, 5), "float32")))
    assert np.all(np.isfinite(keras.ops.convert_to_numpy(scores["log_probabilities"])))
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(weights), [[1.0], [1.0]])
