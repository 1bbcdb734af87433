"""MultiHeadAttention with every mechanism of the zoo: options reach the
mechanism, mechanisms with weights get them as layer variables, and the
layer round-trips through its config."""

import json

import keras
import numpy as np
import pytest

from attention_zoo_keras.attention import registry
from attention_zoo_keras.layers.multi_head_attention import MultiHeadAttention

HEADS, HEAD_DIM, WIDTH = 2, 4, 8

# Every registered mechanism, with options that differ from its defaults.
CONFIGS = {
    "softmax": {"scale": 0.3},
    "linear": {"feature_map": "relu", "chunk_size": 4},
    "relative": {"max_distance": 3, "per_head": True},
    "local": {"block_size": 3, "num_memory_blocks": 1},
    "local_2d": {"image_shape": (3, 4), "block_shape": (2, 2), "memory_flange": (1, 1)},
    "sparse": {"pattern": "fixed", "stride": 4, "c": 2},
    "additive": {"units": 6},
    "xl": {"per_layer_biases": True},
    "lsh": {"num_hashes": 2, "num_buckets": 4, "chunk_length": 4, "seed": 0},
}


def call_inputs(name, length):
    """A mechanism's per-call inputs (`registry.mechanism_inputs`): for
    Transformer-XL, distance encodings already projected to heads."""
    rng = np.random.default_rng(7)
    return {
        argument: rng.standard_normal((length, HEADS, HEAD_DIM)).astype("float32")
        for argument in registry.mechanism_inputs(name)
    }


def numpy(x):
    return keras.ops.convert_to_numpy(x)


def projections(layer, x):
    """The layer's query, key and value heads for self-attention on `x`."""
    def heads(dense):
        return numpy(dense(x)).reshape(x.shape[0], x.shape[1], HEADS, HEAD_DIM)

    return heads(layer.query_dense), heads(layer.key_dense), heads(layer.value_dense)


def test_every_mechanism_is_configured_here():
    assert set(CONFIGS) == set(registry.mechanism_names())


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("is_causal", [False, True])
def test_layer_applies_the_mechanism_with_its_options_and_weights(name, is_causal):
    options = CONFIGS[name]
    layer = MultiHeadAttention(num_heads=HEADS, head_dim=HEAD_DIM, attention=name, attention_options=options)
    x = np.random.default_rng(0).standard_normal((2, 12, WIDTH)).astype("float32")
    mask = np.ones((2, 1, 12), bool)
    mask[1, 0, 9:] = False
    inputs = call_inputs(name, 12)
    out = numpy(layer(x, attention_mask=mask, is_causal=is_causal, mechanism_arguments=inputs))

    query, key, value = projections(layer, x)
    weights = {argument: numpy(variable) for argument, variable in layer.mechanism_weights.items()}
    attended = registry.get_mechanism(name)(
        query, key, value, attention_mask=mask[:, None], is_causal=is_causal,
        **registry.call_options(name, options), **weights, **inputs,
    )
    expected = numpy(layer.output_dense(numpy(attended).reshape(2, 12, HEADS * HEAD_DIM)))
    np.testing.assert_allclose(out, expected, atol=1e-5)


def test_options_change_the_output():
    """The options really reach the mechanism: a smaller window differs."""
    x = np.random.default_rng(1).standard_normal((1, 12, WIDTH)).astype("float32")
    wide = MultiHeadAttention(HEADS, HEAD_DIM, attention="local", attention_options={"block_size": 12})
    narrow = MultiHeadAttention(HEADS, HEAD_DIM, attention="local", attention_options={"block_size": 2,
                                                                                      "num_memory_blocks": 0})
    wide.build((1, 12, WIDTH))
    narrow.build((1, 12, WIDTH))
    narrow.set_weights(wide.get_weights())
    dense = MultiHeadAttention(HEADS, HEAD_DIM)
    dense.build((1, 12, WIDTH))
    dense.set_weights(wide.get_weights())
    np.testing.assert_allclose(numpy(wide(x)), numpy(dense(x)), atol=1e-5)  # one block: all keys
    assert np.abs(numpy(narrow(x)) - numpy(dense(x))).max() > 1e-2


def test_weights_of_relative_and_additive_attention():
    relative = MultiHeadAttention(HEADS, HEAD_DIM, attention="relative",
                                  attention_options={"max_distance": 5, "value_embeddings": False})
    relative.build((1, 3, WIDTH))
    assert {name: tuple(v.shape) for name, v in relative.mechanism_weights.items()} == {
        "relative_key_embeddings": (11, HEAD_DIM)
    }
    per_head = MultiHeadAttention(HEADS, HEAD_DIM, attention="relative", attention_options={"per_head": True})
    per_head.build((1, 3, WIDTH))
    assert tuple(per_head.mechanism_weights["relative_value_embeddings"].shape) == (HEADS, 33, HEAD_DIM)
    additive = MultiHeadAttention(HEADS, HEAD_DIM, attention="additive")
    additive.build((1, 3, WIDTH))
    assert {name: tuple(v.shape) for name, v in additive.mechanism_weights.items()} == {
        "query_kernel": (HEADS, HEAD_DIM, HEAD_DIM),
        "key_kernel": (HEADS, HEAD_DIM, HEAD_DIM),
        "score_vector": (HEADS, HEAD_DIM),
    }
    assert all(any(v is w for w in additive.trainable_weights) for v in additive.mechanism_weights.values())
    assert MultiHeadAttention(HEADS, HEAD_DIM).mechanism_weights == {}


def test_mechanism_weights_are_trained():
    layer = MultiHeadAttention(HEADS, HEAD_DIM, attention="relative", attention_options={"max_distance": 2})
    inputs = keras.Input((6, WIDTH))
    model = keras.Model(inputs, layer(inputs, is_causal=True))
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    before = numpy(layer.mechanism_weights["relative_key_embeddings"]).copy()
    rng = np.random.default_rng(0)
    model.fit(rng.standard_normal((4, 6, WIDTH)), rng.standard_normal((4, 6, WIDTH)), epochs=1, verbose=0)
    assert np.abs(numpy(layer.mechanism_weights["relative_key_embeddings"]) - before).max() > 0


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_config_round_trip_through_json(name):
    layer = MultiHeadAttention(HEADS, HEAD_DIM, attention=name, attention_options=CONFIGS[name])
    x = np.random.default_rng(2).standard_normal((1, 12, WIDTH)).astype("float32")
    inputs = call_inputs(name, 12)
    out = numpy(layer(x, is_causal=True, mechanism_arguments=inputs))
    config = json.loads(json.dumps(layer.get_config()))  # tuples become lists, as in a saved preset
    restored = MultiHeadAttention.from_config(config)
    restored.build((1, 12, WIDTH))
    restored.set_weights(layer.get_weights())
    np.testing.assert_allclose(numpy(restored(x, is_causal=True, mechanism_arguments=inputs)), out, atol=1e-6)


def test_unknown_option_is_named_with_close_names():
    with pytest.raises(ValueError, match=r"'local' has no option 'blok_size'\. Did you mean: block_size\?"):
        MultiHeadAttention(HEADS, HEAD_DIM, attention="local", attention_options={"blok_size": 4})
    with pytest.raises(ValueError, match="'softmax' has no option 'max_distance'.*Its options: scale"):
        MultiHeadAttention(HEADS, HEAD_DIM, attention_options={"max_distance": 4})
    with pytest.raises(ValueError, match="'relative' has no option 'query_offset'"):
        MultiHeadAttention(HEADS, HEAD_DIM, attention="relative", attention_options={"query_offset": 1})


def test_a_missing_per_call_input_is_named():
    layer = MultiHeadAttention(HEADS, HEAD_DIM, attention="xl")
    with pytest.raises(ValueError, match="'xl' attention mechanism needs position_keys"):
        layer(np.zeros((1, 3, WIDTH), "float32"), is_causal=True)


def test_mechanism_options_lists_both_functions():
    assert registry.mechanism_options("relative") == {
        "max_distance": 16, "scale": None, "per_head": False, "value_embeddings": True,
    }
    assert registry.mechanism_options("additive") == {"units": None}
    assert registry.call_options("relative", {"max_distance": 4, "per_head": True}) == {"max_distance": 4}
