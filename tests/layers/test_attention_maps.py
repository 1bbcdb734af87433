"""`attention_maps` returns the attention probabilities of every
`MultiHeadAttention` call, for every mechanism: rows sum to 1 over the keys
a query may attend to (0 elsewhere), the probabilities times the layer's own
value projections give the layer's output, softmax and additive maps equal a
NumPy recomputation from the layer's projections, and nothing is recorded or
changed when no maps are asked for. `plot_attention` draws one panel per
head."""

import keras
import numpy as np
import pytest

import attention_zoo_keras as azk
from attention_zoo_keras.layers import MultiHeadAttention
from attention_zoo_keras.layers.attention_maps import active_recorder
from tests.support.tiny_models import task_cases
from tests.support.tiny_models import tiny_bert

BATCH, LENGTH, DIM, HEADS = 2, 8, 16, 2
HEAD_DIM = DIM // HEADS
KEY_PADDING = np.array([[1] * 8, [1] * 5 + [0] * 3], dtype=bool)  # row 1: three padded keys

CASES = {
    "softmax": ("softmax", {}, False),
    "softmax_causal": ("softmax", {}, True),
    "relative": ("relative", {"max_distance": 3, "value_embeddings": False}, False),
    "local_causal": ("local", {"block_size": 2, "num_memory_blocks": 1}, True),
    "sparse": ("sparse", {"pattern": "strided", "stride": 2, "c": 1}, False),
    "additive": ("additive", {"units": 6}, False),
    "linear": ("linear", {}, False),
    "lsh": ("lsh", {"num_hashes": 2, "chunk_length": 2, "num_buckets": 4, "seed": 3}, False),
    # Rotations drawn from the layer's seed generator at every call: the maps must be this call's.
    "lsh_drawn_rotations": ("lsh", {"num_hashes": 2, "chunk_length": 2, "num_buckets": 4}, False),
}


def _layer_and_inputs(mechanism, options):
    keras.utils.set_random_seed(0)
    layer = MultiHeadAttention(
        num_heads=HEADS, head_dim=HEAD_DIM, attention=mechanism, attention_options=options,
        shared_query_key=mechanism == "lsh",
    )
    x = np.random.default_rng(0).normal(size=(BATCH, LENGTH, DIM)).astype("float32")
    return layer, x


def _allowed(is_causal):
    """`(B, 1, T, S)`: the keys each query may attend to."""
    allowed = np.broadcast_to(KEY_PADDING[:, None, None, :], (BATCH, 1, LENGTH, LENGTH))
    if is_causal:
        allowed = allowed & np.tril(np.ones((LENGTH, LENGTH), bool))
    return allowed


def _projection(dense, x):
    kernel, bias = (keras.ops.convert_to_numpy(w) for w in (dense.kernel, dense.bias))
    return (x @ kernel + bias).reshape(x.shape[0], x.shape[1], HEADS, HEAD_DIM)


def _maps_of(layer, x, is_causal, hash_rounds=False):
    """The maps of one call of `layer` on `x`, and that call's output."""
    mask = KEY_PADDING[:, None, :]  # (B, 1, S): a key-padding mask, which every mechanism takes
    outputs = []

    def call(x, training):
        outputs.append(layer(x, attention_mask=mask, is_causal=is_causal, training=training))

    maps = azk.attention_maps(call, x, hash_rounds=hash_rounds)
    assert list(maps) == [layer.path]
    return maps[layer.path], keras.ops.convert_to_numpy(outputs[0])


def test_relative_value_embeddings_leave_the_maps_those_of_the_logits():
    """w^V adds to the output, not to the weights: the maps are taken without it."""
    layer, x = _layer_and_inputs("relative", {"max_distance": 3, "value_embeddings": True})
    probabilities, _ = _maps_of(layer, x, False)
    np.testing.assert_allclose(probabilities.sum(-1), 1.0, atol=1e-5)
    assert np.all(probabilities[~np.broadcast_to(_allowed(False), probabilities.shape)] == 0.0)
    without = MultiHeadAttention(
        num_heads=HEADS, head_dim=HEAD_DIM, attention="relative",
        attention_options={"max_distance": 3, "value_embeddings": False},
    )
    without(x)
    for name in ("query", "key"):
        for weight, source in zip(getattr(without, f"{name}_dense").weights, getattr(layer, f"{name}_dense").weights):
            weight.assign(source)
    without.mechanism_weights["relative_key_embeddings"].assign(layer.mechanism_weights["relative_key_embeddings"])
    np.testing.assert_allclose(_maps_of(without, x, False)[0], probabilities, atol=1e-6)


@pytest.mark.parametrize("case", sorted(CASES))
def test_rows_sum_to_one_over_the_allowed_keys_and_reproduce_the_output(case):
    mechanism, options, is_causal = CASES[case]
    layer, x = _layer_and_inputs(mechanism, options)
    probabilities, output = _maps_of(layer, x, is_causal)
    assert probabilities.shape == (BATCH, HEADS, LENGTH, LENGTH)
    allowed = np.broadcast_to(_allowed(is_causal), probabilities.shape)
    np.testing.assert_allclose(probabilities.sum(-1), 1.0, atol=1e-4)
    assert np.all(probabilities[~allowed] == 0.0)
    assert np.all(probabilities >= 0.0)
    # The layer's output is these weights applied to its own value heads.
    values = _projection(layer.value_dense, x)
    attended = np.einsum("bnts,bsnh->btnh", probabilities, values).reshape(BATCH, LENGTH, DIM)
    expected = attended @ keras.ops.convert_to_numpy(layer.output_dense.kernel) + keras.ops.convert_to_numpy(
        layer.output_dense.bias
    )
    np.testing.assert_allclose(output, expected, atol=1e-5)


def test_lsh_hash_rounds_each_sum_to_one_and_mix_into_the_combined_map():
    _, options, _ = CASES["lsh"]
    layer, x = _layer_and_inputs("lsh", options)
    rounds, _ = _maps_of(layer, x, False, hash_rounds=True)
    combined, _ = _maps_of(layer, x, False)
    assert rounds.shape == (BATCH, HEADS, 2, LENGTH, LENGTH)
    np.testing.assert_allclose(rounds.sum(-1), 1.0, atol=1e-5)
    assert np.all(rounds[~np.broadcast_to(_allowed(False)[:, :, None], rounds.shape)] == 0.0)
    # Each combined row is a convex mix w·P₀ + (1 − w)·P₁ of the rounds' rows.
    first, second = rounds[:, :, 0], rounds[:, :, 1]
    difference = first - second
    norm = (difference**2).sum(-1)
    share = np.where(norm > 0, ((combined - second) * difference).sum(-1) / np.where(norm > 0, norm, 1.0), 0.5)
    assert np.all((share > -1e-4) & (share < 1 + 1e-4))
    np.testing.assert_allclose(second + share[..., None] * difference, combined, atol=1e-5)
    assert not np.allclose(first, second)  # the two rounds hashed differently


def test_hash_rounds_leave_other_mechanisms_maps_as_they_are():
    layer, x = _layer_and_inputs("softmax", {})
    np.testing.assert_array_equal(_maps_of(layer, x, False, hash_rounds=True)[0], _maps_of(layer, x, False)[0])


@pytest.mark.parametrize("case", ["softmax", "softmax_causal"])
def test_softmax_maps_equal_a_numpy_recomputation(case):
    _, options, is_causal = CASES[case]
    layer, x = _layer_and_inputs("softmax", options)
    probabilities, _ = _maps_of(layer, x, is_causal)
    query, key = _projection(layer.query_dense, x), _projection(layer.key_dense, x)
    logits = np.einsum("btnh,bsnh->bnts", query, key) / np.sqrt(HEAD_DIM)
    logits = np.where(_allowed(is_causal), logits, -np.inf)
    expected = np.exp(logits - logits.max(-1, keepdims=True))
    expected /= expected.sum(-1, keepdims=True)
    np.testing.assert_allclose(probabilities, expected, atol=1e-6)


def test_additive_maps_equal_a_numpy_recomputation():
    layer, x = _layer_and_inputs("additive", {"units": 6})
    layer(x)  # built: its score vector starts at zero (uniform weights); give it values
    layer.mechanism_weights["score_vector"].assign(np.random.default_rng(1).normal(size=(HEADS, 6)))
    probabilities, _ = _maps_of(layer, x, False)
    query, key = _projection(layer.query_dense, x), _projection(layer.key_dense, x)
    weights = {name: keras.ops.convert_to_numpy(w) for name, w in layer.mechanism_weights.items()}
    # Bahdanau et al.: score(q, k) = vᵀ tanh(W_q q + W_k k), per head.
    projected_query = np.einsum("btnh,nhu->bntu", query, weights["query_kernel"])
    projected_key = np.einsum("bsnh,nhu->bnsu", key, weights["key_kernel"])
    scores = np.einsum(
        "bntsu,nu->bnts", np.tanh(projected_query[:, :, :, None] + projected_key[:, :, None]), weights["score_vector"]
    )
    scores = np.where(_allowed(False), scores, -np.inf)
    expected = np.exp(scores - scores.max(-1, keepdims=True))
    expected /= expected.sum(-1, keepdims=True)
    np.testing.assert_allclose(probabilities, expected, atol=1e-5)


def test_nothing_is_recorded_or_changed_unless_maps_are_asked_for():
    keras.utils.set_random_seed(0)
    backbone = tiny_bert(num_layers=2, dropout=0.0)
    inputs = {
        "token_ids": np.array([[5, 6, 7, 8, 0, 0]]),
        "segment_ids": np.zeros((1, 6), "int32"),
        "padding_mask": np.array([[1, 1, 1, 1, 0, 0]]),
    }
    before = keras.ops.convert_to_numpy(backbone(inputs)["sequence_output"])
    maps = azk.attention_maps(backbone, inputs)
    after = keras.ops.convert_to_numpy(backbone(inputs)["sequence_output"])
    assert active_recorder() is None
    np.testing.assert_array_equal(before, after)
    assert len(maps) == 2
    for probabilities in maps.values():
        np.testing.assert_allclose(probabilities.sum(-1), 1.0, atol=1e-5)
        assert np.all(probabilities[..., 4:] == 0.0)  # the padded keys


@pytest.mark.parametrize("case", sorted(task_cases()))
def test_every_family_gives_a_map_per_attention_call(case):
    """Self-, cross- and co-attention, Transformer-XL's memory, the
    Reformer's LSH and local layers, linear attention."""
    keras.utils.set_random_seed(0)
    model, x = task_cases()[case]()
    x = {name: value[:2] for name, value in x.items()}
    maps = azk.attention_maps(model, x)
    attention_layers = {layer.path for layer in model._flatten_layers() if isinstance(layer, MultiHeadAttention)}
    assert {name.split("#")[0] for name in maps} == attention_layers
    for name, probabilities in maps.items():
        assert probabilities.ndim == 4 and probabilities.shape[0] == 2, name
        np.testing.assert_allclose(probabilities.sum(-1), 1.0, atol=1e-5, err_msg=name)


def test_plot_attention_draws_one_labelled_panel_per_head():
    pytest.importorskip("matplotlib")
    figure = azk.plot_attention(np.full((3, 2, 4), 0.25), query_labels=["a", "b"], key_labels=list("wxyz"), heads=[0, 2])
    assert [axis.get_title() for axis in figure.axes] == ["head 0", "head 2"]
    assert [label.get_text() for label in figure.axes[0].get_xticklabels()] == list("wxyz")
    with pytest.raises(ValueError, match="3 labels for 2 queries"):
        azk.plot_attention(np.full((2, 4), 0.25), query_labels=["a", "b", "c"])
    with pytest.raises(ValueError, match=r"maps\[name\]\[0\]"):
        azk.plot_attention(np.zeros((1, 2, 2, 2)))


def test_a_language_model_s_preprocessor_output_is_taken_as_it_comes():
    """A causal LM's preprocessor gives `(x, y, sample_weight)`; the maps
    are those of `x`."""
    tokenizer = azk.models.GPTTokenizer.from_vocabulary(
        {"<|endoftext|>": 0, "a": 1, "b": 2, "Ġ": 3, "ab": 4, "Ġab": 5}, [("a", "b"), ("Ġ", "ab")])
    backbone = azk.models.GPTBackbone(vocabulary_size=6, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16,
                                      max_sequence_length=16)
    lm = azk.models.GPTCausalLM(backbone, preprocessor=azk.models.GPTCausalLMPreprocessor(tokenizer, sequence_length=8))
    batch = lm.preprocessor(["ab ab", "ab"])
    assert isinstance(batch, tuple)
    maps = azk.attention_maps(lm, batch)
    expected = azk.attention_maps(lm, batch[0])
    assert list(maps) == list(expected)
    for name in maps:
        np.testing.assert_array_equal(maps[name], expected[name])
