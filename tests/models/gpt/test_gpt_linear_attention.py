"""A GPT with linear attention (Katharopoulos et al., 2020) decodes with the
recurrent state (S, z) as its cache: cached logits equal the full forward
pass, generation equals recomputation with full passes, the cache's size does
not depend on the length, and the model trains."""

import keras
import numpy as np
import pytest

from attention_zoo_keras.attention import linear_decoding
from attention_zoo_keras.attention import registry
from attention_zoo_keras.attention import softmax
from attention_zoo_keras.models.gpt import GPTBackbone
from attention_zoo_keras.models.gpt import GPTCausalLM
from tests.support.gpt_decoding import full_logits
from tests.support.gpt_decoding import greedy_by_full_passes
from tests.support.gpt_decoding import numpy
from tests.support.gpt_decoding import right_padded_inputs

ATOL = 1e-4
VOCABULARY = 40
NEW_TOKENS = 6


def tiny_backbone(**overrides):
    config = dict(
        vocabulary_size=VOCABULARY, num_layers=2, num_heads=2, hidden_dim=16, intermediate_dim=32,
        max_sequence_length=48, dropout=0.0, attention_dropout=0.0, attention="linear",
    )
    config.update(overrides)
    return GPTBackbone(**config)


@pytest.fixture(scope="module")
def lm():
    """The same weights on every backend (drawn in numpy), scaled so that
    logits lie far apart and greedy choices are not near-ties."""
    lm = GPTCausalLM(backbone=tiny_backbone())
    rng = np.random.default_rng(0)
    for variable in lm.weights:
        noise = rng.normal(0.0, 0.3, variable.shape)
        variable.assign((1.0 + noise if variable.path.endswith("gamma") else noise).astype("float32"))
    return lm


def test_the_decoding_protocol_is_the_mechanisms():
    assert isinstance(registry.get_decoding("linear"), linear_decoding.RecurrentState)
    assert isinstance(registry.get_decoding("softmax"), softmax.KeyValueCache)
    assert not registry.get_decoding("linear").position_addressed
    assert registry.get_decoding("softmax").position_addressed
    with pytest.raises(ValueError, match="Unknown attention mechanism 'lineer'"):
        registry.get_decoding("lineer")


def test_a_mechanism_without_decoding_is_refused_clearly(monkeypatch):
    without_decoding = registry.RegisteredMechanism(softmax.softmax_attention)
    monkeypatch.setitem(registry._MECHANISMS._entries, "no_decoding", without_decoding)
    known = "additive, linear, local, lsh, relative, softmax, sparse"
    with pytest.raises(ValueError, match=f"'no_decoding' has no incremental decoding.*{known}"):
        registry.get_decoding("no_decoding")
    with pytest.raises(TypeError, match="must be a DecodingCache"):
        registry.register_decoding("no_decoding", object())
    with pytest.raises(ValueError, match="already has a decoding cache"):
        registry.register_decoding("linear", linear_decoding.RecurrentState())


def test_cached_logits_match_full_forward(lm):
    rng = np.random.default_rng(0)
    batch, length = 3, 11
    token_ids = rng.integers(0, VOCABULARY, size=(batch, length)).astype("int32")
    full = full_logits(lm, token_ids)

    # Token by token.
    cache = lm.init_cache(batch, length)
    for index in range(length):
        logits, _, cache = lm.call_with_cache(token_ids[:, index : index + 1], cache, index)
        np.testing.assert_allclose(numpy(logits)[:, 0], full[:, index], atol=ATOL)

    # A multi-token prefill, then steps, with a padding mask over absolute
    # positions.
    cache = lm.init_cache(batch, length)
    prefix = 5
    mask = np.ones((batch, length), "int32")
    logits, hidden, cache = lm.call_with_cache(token_ids[:, :prefix], cache, 0, padding_mask=mask)
    assert tuple(hidden.shape) == (batch, prefix, lm.backbone.hidden_dim)
    np.testing.assert_allclose(numpy(logits), full[:, :prefix], atol=ATOL)
    for index in range(prefix, length):
        logits, _, cache = lm.call_with_cache(token_ids[:, index : index + 1], cache, index, padding_mask=mask)
        np.testing.assert_allclose(numpy(logits)[:, 0], full[:, index], atol=ATOL)

    # Two prefills in a row continue the state.
    cache = lm.init_cache(batch, length)
    _, _, cache = lm.call_with_cache(token_ids[:, :4], cache, 0)
    logits, _, cache = lm.call_with_cache(token_ids[:, 4:], cache, 4)
    np.testing.assert_allclose(numpy(logits), full[:, 4:], atol=ATOL)


def test_cache_size_does_not_depend_on_the_length(lm):
    backbone = lm.backbone
    head_dim = backbone.hidden_dim // backbone.num_heads
    short, long = lm.init_cache(2, 8), lm.init_cache(2, 4096)
    shapes = [tuple(tuple(t.shape) for t in layer) for layer in short]
    assert shapes == [tuple(tuple(t.shape) for t in layer) for layer in long]
    assert shapes == [((2, backbone.num_heads, head_dim, head_dim), (2, backbone.num_heads, head_dim))] * 2
    # Still the same shapes (and float32) after tokens went in.
    token_ids = np.ones((2, 7), "int32")
    _, _, cache = lm.call_with_cache(token_ids, short, 0)
    _, _, cache = lm.call_with_cache(token_ids[:, :1], cache, 7)
    assert [tuple(tuple(t.shape) for t in layer) for layer in cache] == shapes
    assert {keras.backend.standardize_dtype(t.dtype) for layer in cache for t in layer} == {"float32"}


@pytest.mark.parametrize(
    "prompts",
    [
        [[3, 14, 15, 9, 2], [7], [26, 5, 35]],  # the shortest has one token: no prompt pass
        [[1, 2, 3, 4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15, 16, 17]],
    ],
)
def test_greedy_generation_equals_recomputation(lm, prompts):
    result = lm.generate(right_padded_inputs(prompts), max_new_tokens=NEW_TOKENS, stop_token_ids=None)
    for row, prompt in enumerate(prompts):
        ours = result["token_ids"][row][result["padding_mask"][row].astype(bool)].tolist()
        assert ours == greedy_by_full_passes(lm, prompt, NEW_TOKENS), f"prompt {row}"


def test_sampling_and_beam_search_run(lm):
    prompts = right_padded_inputs([[3, 14, 15, 9, 2], [7], [26, 5, 35]])
    greedy = lm.generate(prompts, max_new_tokens=NEW_TOKENS, stop_token_ids=None)

    def sample(seed, **options):
        return lm.generate(prompts, max_new_tokens=NEW_TOKENS, stop_token_ids=None, sampler="top_k", seed=seed,
                           **options)

    first = sample(1, k=5)
    assert first["token_ids"].shape == (3, 5 + NEW_TOKENS)
    assert first["padding_mask"].sum(axis=1).tolist() == [5 + NEW_TOKENS, 1 + NEW_TOKENS, 3 + NEW_TOKENS]
    np.testing.assert_array_equal(sample(1, k=5)["token_ids"], first["token_ids"])
    np.testing.assert_array_equal(sample(2, k=1)["token_ids"], greedy["token_ids"])

    beams = lm.generate(prompts, max_new_tokens=NEW_TOKENS, stop_token_ids=None, sampler="beam", num_beams=3)
    assert beams["token_ids"].shape == (3, 5 + NEW_TOKENS)
    assert beams["padding_mask"].sum(axis=1).tolist() == [5 + NEW_TOKENS, 1 + NEW_TOKENS, 3 + NEW_TOKENS]
    one_beam = lm.generate(prompts, max_new_tokens=NEW_TOKENS, stop_token_ids=None, sampler="beam", num_beams=1)
    np.testing.assert_array_equal(one_beam["token_ids"], greedy["token_ids"])


@pytest.mark.slow
def test_fit_lowers_the_loss():
    keras.utils.set_random_seed(1)
    lm = GPTCausalLM(backbone=tiny_backbone())
    rng = np.random.default_rng(1)
    # Sequences that count up modulo the vocabulary: learnable next tokens.
    starts = rng.integers(0, VOCABULARY, size=(32, 1))
    sequences = ((starts + np.arange(13)[None, :]) % VOCABULARY).astype("int32")
    x = {"token_ids": sequences[:, :-1], "padding_mask": np.ones((32, 12), "int32")}
    y = sequences[:, 1:]
    lm.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    before = lm.evaluate(x, y, verbose=0, return_dict=True)["loss"]
    lm.fit(x, y, batch_size=8, epochs=5, verbose=0)
    after = lm.evaluate(x, y, verbose=0, return_dict=True)["loss"]
    assert after < 0.5 * before, (before, after)


def test_attention_dropout_is_refused_at_construction():
    with pytest.raises(ValueError, match=r"attention='linear'\) needs attention_dropout=0.0; got 0.1"):
        tiny_backbone(attention_dropout=0.1)
