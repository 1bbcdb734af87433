"""One `generate` for every generative task (issue 19, "One API, the same
everywhere"): the same arguments with the same meanings on the decoder-only
language models and the encoder-decoder — `num_beams > 1` alone is beam
search, `sampler="beam"` still is, one beam is greedy decoding, and
`max_new_tokens` counts the tokens after the prompt (after the decoder start
token)."""

import inspect

import numpy as np
import pytest

from attention_zoo_keras.models.generative_task import GenerativeTask
from attention_zoo_keras.models.gpt import GPTBackbone
from attention_zoo_keras.models.gpt import GPTCausalLM
from attention_zoo_keras.models.reformer import ReformerCausalLM
from attention_zoo_keras.models.transformer import TransformerBackbone
from attention_zoo_keras.models.transformer import TransformerSeq2SeqLM
from attention_zoo_keras.models.transformer_xl import TransformerXLCausalLM

VOCABULARY = 24
START_ID = 0
SHARED_ARGUMENTS = ["max_length", "max_new_tokens", "sampler", "num_beams", "length_penalty", "stop_token_ids", "seed"]


def _randomized(model, seed=0):
    """`model` with weights drawn in numpy (the same on every backend),
    large enough that its choices are not near-ties."""
    rng = np.random.default_rng(seed)
    for variable in model.weights:
        if not variable.path.endswith(("bias", "beta", "gamma")):
            variable.assign(rng.normal(0.0, 0.5, variable.shape).astype(variable.dtype))
    return model


@pytest.fixture(scope="module")
def lm():
    backbone = GPTBackbone(
        vocabulary_size=VOCABULARY, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16, dropout=0.0,
        attention_dropout=0.0, max_sequence_length=16,
    )
    return _randomized(GPTCausalLM(backbone))


@pytest.fixture(scope="module")
def mt():
    backbone = TransformerBackbone(
        vocabulary_size=VOCABULARY, num_encoder_layers=1, num_decoder_layers=1, num_heads=2, hidden_dim=8,
        intermediate_dim=16, max_sequence_length=16, dropout=0.0, attention_dropout=0.0,
    )
    return _randomized(TransformerSeq2SeqLM(backbone))


PROMPTS = {"token_ids": np.array([[3, 4, 5], [6, 7, 0]], "int32"), "padding_mask": np.array([[1, 1, 1], [1, 1, 0]])}
SOURCES = {
    "encoder_token_ids": np.array([[3, 4, 5], [6, 7, 0]], "int32"),
    "encoder_padding_mask": np.array([[1, 1, 1], [1, 1, 0]]),
}


@pytest.fixture(params=["lm", "mt"])
def task_and_inputs(request):
    """Each kind of generative task with its inputs and fixed arguments."""
    if request.param == "lm":
        return request.getfixturevalue("lm"), PROMPTS, {"max_new_tokens": 4, "stop_token_ids": None}
    arguments = {"max_new_tokens": 4, "stop_token_ids": None, "decoder_start_token_id": START_ID}
    return request.getfixturevalue("mt"), SOURCES, arguments


def _rows(output):
    return [ids[mask.astype(bool)].tolist() for ids, mask in zip(output["token_ids"], output["padding_mask"])]


@pytest.mark.parametrize("cls", [GPTCausalLM, ReformerCausalLM, TransformerXLCausalLM, TransformerSeq2SeqLM])
def test_every_generative_task_has_the_one_generate(cls):
    assert cls.generate is GenerativeTask.generate
    parameters = inspect.signature(cls.generate).parameters
    assert all(name in parameters for name in SHARED_ARGUMENTS)


def test_num_beams_alone_is_beam_search(task_and_inputs):
    task, inputs, arguments = task_and_inputs
    beams = _rows(task.generate(inputs, num_beams=3, **arguments))
    assert beams == _rows(task.generate(inputs, sampler="beam", num_beams=3, **arguments))
    # With a length penalty that favours long hypotheses, as in `transformers`.
    assert _rows(task.generate(inputs, num_beams=3, length_penalty=2.0, **arguments)) == _rows(
        task.generate(inputs, sampler="beam", num_beams=3, length_penalty=2.0, **arguments)
    )


def test_sampler_beam_alone_searches_with_four_beams(task_and_inputs):
    task, inputs, arguments = task_and_inputs
    assert _rows(task.generate(inputs, sampler="beam", **arguments)) == _rows(
        task.generate(inputs, num_beams=4, **arguments)
    )


def test_one_beam_without_a_sampler_is_greedy(task_and_inputs):
    task, inputs, arguments = task_and_inputs
    greedy = _rows(task.generate(inputs, sampler="greedy", **arguments))
    assert _rows(task.generate(inputs, **arguments)) == greedy
    assert _rows(task.generate(inputs, num_beams=1, **arguments)) == greedy


def test_a_sampler_with_one_beam_samples(task_and_inputs):
    task, inputs, arguments = task_and_inputs
    sampled = _rows(task.generate(inputs, sampler="top_k", k=3, seed=0, **arguments))
    assert _rows(task.generate(inputs, sampler="top_k", k=3, seed=0, num_beams=1, **arguments)) == sampled


def test_max_new_tokens_counts_the_tokens_after_the_prompt(task_and_inputs):
    """`max_new_tokens=n` adds `n` tokens to every row: after each prompt
    (a decoder-only model), after the decoder start token (the
    encoder-decoder, whose `max_length` counts that token)."""
    task, inputs, arguments = task_and_inputs
    output = task.generate(inputs, **{**arguments, "max_new_tokens": 3})
    if isinstance(task, TransformerSeq2SeqLM):
        assert [len(row) for row in _rows(output)] == [4, 4]
        arguments = {**arguments, "max_new_tokens": None, "max_length": 4}
        assert _rows(task.generate(inputs, **arguments)) == _rows(output)
    else:
        assert [len(row) for row in _rows(output)] == [3 + 3, 2 + 3]


def test_the_seq2seq_model_takes_max_new_tokens_with_its_rules(mt):
    """A row that reaches its last position ends with the forced end token,
    counted among the `max_new_tokens`."""
    output = mt.generate(SOURCES, max_new_tokens=3, stop_token_ids=[1], decoder_start_token_id=START_ID)
    assert all(len(row) <= 4 and (row[-1] == 1) for row in _rows(output))
