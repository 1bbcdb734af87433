"""Samplers draw exactly from their (truncated, tempered) distributions.

Every random sampler inverts a cumulative distribution at a given uniform,
so feeding it the evenly spaced uniforms (i + ½) / N must reproduce each
token's probability to within 1/N: an exact check, computed here in numpy
from the definitions (softmax with temperature, top-k, nucleus).
"""

import keras
import numpy as np
import pytest

from attention_zoo_keras.generation import GreedySampler
from attention_zoo_keras.generation import TemperatureSampler
from attention_zoo_keras.generation import TopKSampler
from attention_zoo_keras.generation import TopPSampler
from attention_zoo_keras.generation import get_sampler
from attention_zoo_keras.generation import sampler_names

LOGITS = np.array([1.2, -0.3, 2.5, 0.4, 2.1, -1.0, 0.9], dtype="float32")
DRAWS = 2000


def _softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()


def _frequencies(sampler, logits=LOGITS):
    uniforms = ((np.arange(DRAWS) + 0.5) / DRAWS).astype("float32")
    batch = np.repeat(logits[None, :], DRAWS, axis=0)
    tokens = keras.ops.convert_to_numpy(sampler.choose(batch, uniforms))
    assert tokens.dtype == np.int32
    return np.bincount(tokens, minlength=len(logits)) / DRAWS


def test_greedy_is_argmax():
    logits = np.array([[0.1, 3.0, -1.0], [5.0, 4.9, 0.0]], dtype="float32")
    tokens = keras.ops.convert_to_numpy(GreedySampler().choose(logits, np.zeros(2, "float32")))
    assert tokens.tolist() == [1, 0]


@pytest.mark.parametrize("temperature", [1.0, 0.5, 2.0])
def test_temperature_sampling_follows_the_tempered_softmax(temperature):
    expected = _softmax(LOGITS.astype("float64") / temperature)
    np.testing.assert_allclose(_frequencies(TemperatureSampler(temperature)), expected, atol=1.5 / DRAWS)


@pytest.mark.parametrize("k", [1, 3, 7, 50])
def test_top_k_draws_among_the_k_most_likely(k):
    expected = np.zeros(len(LOGITS))
    top = np.argsort(-LOGITS)[:k]
    expected[top] = _softmax(LOGITS[top].astype("float64") / 0.8)
    np.testing.assert_allclose(_frequencies(TopKSampler(k=k, temperature=0.8)), expected, atol=1.5 / DRAWS)


@pytest.mark.parametrize("p,k", [(0.5, None), (0.75, None), (0.97, None), (1.0, None), (0.97, 3), (0.01, None)])
def test_top_p_draws_from_the_nucleus(p, k):
    probabilities = _softmax(LOGITS.astype("float64") / 1.3)
    order = np.argsort(-probabilities)
    if k is not None:
        order = order[:k]
    mass_before = np.cumsum(probabilities[order]) - probabilities[order]
    nucleus = order[mass_before < p]
    expected = np.zeros(len(LOGITS))
    expected[nucleus] = probabilities[nucleus] / probabilities[nucleus].sum()
    np.testing.assert_allclose(_frequencies(TopPSampler(p=p, temperature=1.3, k=k)), expected, atol=1.5 / DRAWS)


def test_rows_use_their_own_logits_and_uniforms():
    logits = np.array([[0.0, 0.0, 20.0], [20.0, 0.0, 0.0]], dtype="float32")
    tokens = keras.ops.convert_to_numpy(TopKSampler(k=2).choose(logits, np.array([0.3, 0.9], "float32")))
    assert tokens.tolist() == [2, 0]


def test_get_sampler_by_name_and_errors():
    assert isinstance(get_sampler("top_k", k=5), TopKSampler)
    assert get_sampler("top_k", k=5).k == 5
    sampler = TopPSampler(p=0.5)
    assert get_sampler(sampler) is sampler
    assert "beam" in sampler_names()
    with pytest.raises(ValueError, match=r"Unknown sampler 'top-p'\. Did you mean: top_p"):
        get_sampler("top-p")
    with pytest.raises(ValueError, match=r"Sampler 'greedy' takes the options none; got \['temperature'\]"):
        get_sampler("greedy", temperature=0.7)
    with pytest.raises(ValueError, match="set them on the instance"):
        get_sampler(sampler, p=0.3)
    with pytest.raises(ValueError, match="temperature must be positive"):
        TemperatureSampler(0.0)
    with pytest.raises(ValueError, match=r"p must be in \(0, 1\]"):
        TopPSampler(p=1.5)
    with pytest.raises(ValueError, match="k must be a positive integer"):
        TopKSampler(k=0)


def test_an_unknown_sampler_lists_beam_too_and_a_non_name_is_refused():
    with pytest.raises(ValueError, match=r"Known samplers: greedy, temperature, top_k, top_p \(and beam"):
        get_sampler("nucleus")
    with pytest.raises(ValueError, match=r"sampler must be a name \(beam, greedy, .*\) or a Sampler; got 3"):
        get_sampler(3)
