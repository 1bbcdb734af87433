"""The decoding protocol (`registry.DecodingCache`) for every mechanism that
has one: feeding a sequence through the cache — a prompt of several
positions, then one position at a time — gives the mechanism's causal output
on the whole sequence, with and without a key-padding mask, for each
mechanism's options and weights."""

import keras
import numpy as np
import pytest

from attention_zoo_keras.attention import registry

CONFIGS = [
    ("softmax", {}),
    ("linear", {}),
    ("linear", {"feature_map": "relu", "eps": 1e-3}),
    ("relative", {"max_distance": 3}),
    ("relative", {"max_distance": 20, "per_head": True, "value_embeddings": False}),
    ("local", {"block_size": 3, "num_memory_blocks": 1}),
    ("local", {"block_size": 2, "num_memory_blocks": 0}),
    ("sparse", {"pattern": "strided", "stride": 3}),
    ("sparse", {"pattern": "fixed", "stride": 4, "c": 2}),
    ("sparse", {"pattern": "fixed", "stride": 3, "c": 1, "combine": "heads"}),
    ("additive", {"units": 5}),
    ("xl", {}),
]
HEADS, HEAD_DIM = 2, 4


def numpy(x):
    return keras.ops.convert_to_numpy(x)


def config_id(config):
    name, options = config
    return name + "".join(f"-{key}={value}" for key, value in options.items())


def drawn_weights(name, options, rng):
    """The mechanism's weights at the shapes it asks for, drawn in numpy."""
    specs = registry.mechanism_weights(name, HEADS, HEAD_DIM, options)
    return {argument: rng.normal(0.0, 0.5, shape).astype("float32") for argument, (shape, _) in specs.items()}


def call_inputs(name, rng, max_length):
    """Per-call inputs a mechanism takes besides options and weights:
    Transformer-XL's projected distance encodings, one row per distance."""
    if name != "xl":
        return {}
    return {"position_keys": rng.normal(0.0, 0.5, (max_length, HEADS, HEAD_DIM)).astype("float32")}


def decode(name, arguments, query, key, value, prompt_length, max_length, key_padding=None):
    """Outputs for every position: the first `prompt_length` in one call, the
    rest one by one. `key_padding`: `(batch, max_length)` bool or None."""
    decoding = registry.get_decoding(name)
    options = registry.call_options(name, arguments)
    batch, length = query.shape[:2]
    cache = decoding.initial_cache(batch, max_length, HEADS, HEAD_DIM, "float32", **options)
    mask = None if key_padding is None else key_padding[:, None, None, :]
    outputs, start = [], 0
    for stop in [prompt_length] + list(range(prompt_length + 1, length + 1)):
        new = slice(start, stop)
        out, cache = decoding.attend_with_cache(
            query[:, new], key[:, new], value[:, new], cache, start, attention_mask=mask, **arguments
        )
        outputs.append(numpy(out))
        start = stop
    return np.concatenate(outputs, axis=1)


@pytest.mark.parametrize("config", CONFIGS, ids=config_id)
@pytest.mark.parametrize("seed", [0, 1])
def test_decoding_equals_the_causal_mechanism(config, seed):
    name, options = config
    rng = np.random.default_rng(seed)
    batch, length = 2, int(rng.integers(5, 11))
    prompt_length = int(rng.integers(1, length))
    query, key, value = (rng.standard_normal((batch, length, HEADS, HEAD_DIM)).astype("float32") for _ in range(3))
    arguments = {
        **registry.call_options(name, options), **drawn_weights(name, options, rng),
        **call_inputs(name, rng, length + 3),
    }
    expected = numpy(registry.get_mechanism(name)(query, key, value, is_causal=True, **arguments))
    got = decode(name, arguments, query, key, value, prompt_length, max_length=length + 3)
    np.testing.assert_allclose(got, expected, atol=1e-5)


@pytest.mark.parametrize("config", CONFIGS, ids=config_id)
def test_decoding_with_key_padding(config):
    name, options = config
    rng = np.random.default_rng(2)
    batch, length, max_length = 2, 8, 10
    query, key, value = (rng.standard_normal((batch, length, HEADS, HEAD_DIM)).astype("float32") for _ in range(3))
    arguments = {
        **registry.call_options(name, options), **drawn_weights(name, options, rng),
        **call_inputs(name, rng, max_length),
    }
    key_padding = np.ones((batch, max_length), bool)
    key_padding[1, [2, 5]] = False  # two padded positions inside the second sequence
    expected = numpy(
        registry.get_mechanism(name)(
            query, key, value, attention_mask=key_padding[:, None, None, :length], is_causal=True, **arguments
        )
    )
    got = decode(name, arguments, query, key, value, 3, max_length, key_padding)
    # Compared at the real tokens: a padding position's own output is unspecified
    # (with local attention its whole window may be padding).
    real = key_padding[:, :length]
    np.testing.assert_allclose(got[real], expected[real], atol=1e-5)


def test_every_mechanism_but_local_2d_decodes():
    # LSH decodes too, but not as its full pass does (it does not decompose causally): its
    # decoding is checked against transformers' in test_lsh_decoding.
    decodable = {name for name in registry.mechanism_names() if name not in ("local_2d", "lsh")}
    assert decodable == {name for name, _ in CONFIGS}
    registry.get_decoding("lsh")
    with pytest.raises(ValueError, match="'local_2d' has no incremental decoding"):
        registry.get_decoding("local_2d")
