"""Beam search against `transformers`' `generate(num_beams=...)`: the same
best sequence for every prompt, with and without a stop token, for several
length penalties and early-stopping rules."""

import pytest
import torch
import transformers

from attention_zoo_keras.models.gpt import GPTCausalLM
from tests.support.gpt_decoding import PROMPTS
from tests.support.gpt_decoding import right_padded

NEW_TOKENS = 9


@pytest.fixture(scope="module")
def lm(tiny_gpt2_checkpoints):
    return GPTCausalLM.from_preset(str(tiny_gpt2_checkpoints["lm"]))


@pytest.fixture(scope="module")
def reference(tiny_gpt2_checkpoints):
    path = tiny_gpt2_checkpoints["lm"]
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.GPT2LMHeadModel.from_pretrained(path).eval()

    def beam(prompt_ids, num_beams, length_penalty, early_stopping, eos_token_id):
        input_ids = torch.tensor([prompt_ids])
        with torch.no_grad():
            output = model.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                do_sample=False,
                num_beams=num_beams,
                length_penalty=length_penalty,
                early_stopping=early_stopping,
                max_new_tokens=NEW_TOKENS,
                pad_token_id=tokenizer.eos_token_id,
                eos_token_id=eos_token_id,
            )
        return output[0].tolist()

    return tokenizer, beam


def _stop_token(tokenizer, beam):
    """A token the beams of the first prompt emit midway, so that stopping
    matters: the third token of its unconstrained best continuation."""
    prompt = tokenizer(PROMPTS[0])["input_ids"]
    return beam(prompt, 3, 1.0, False, None)[len(prompt) + 2]


@pytest.mark.parametrize(
    "num_beams,length_penalty,early_stopping,with_stop",
    [
        (3, 1.0, False, False),
        (3, 1.0, False, True),
        (4, 0.0, True, True),
        (2, 2.0, "never", True),
        (3, -1.0, False, True),
    ],
)
def test_beam_search_matches_transformers(lm, reference, num_beams, length_penalty, early_stopping, with_stop):
    tokenizer, beam = reference
    stop = _stop_token(tokenizer, beam) if with_stop else None
    encoded = [tokenizer(p)["input_ids"] for p in PROMPTS]
    expected = [beam(ids, num_beams, length_penalty, early_stopping, stop) for ids in encoded]
    if with_stop and length_penalty <= 1.0:  # (a penalty above 1 favours the long beams)
        assert any(len(e) < len(ids) + NEW_TOKENS for e, ids in zip(expected, encoded))  # a stop happened

    token_ids, padding_mask = right_padded(encoded)
    result = lm.generate(
        {"token_ids": token_ids, "padding_mask": padding_mask},
        max_new_tokens=NEW_TOKENS,
        sampler="beam",
        num_beams=num_beams,
        length_penalty=length_penalty,
        early_stopping=early_stopping,
        stop_token_ids=[stop] if with_stop else None,
    )
    for row, reference_ids in enumerate(expected):
        ours = result["token_ids"][row][result["padding_mask"][row].astype(bool)].tolist()
        assert ours == reference_ids, f"prompt {row}"


def test_beam_search_on_text_and_with_max_length(lm, reference):
    tokenizer, beam = reference
    encoded = tokenizer(PROMPTS[2])["input_ids"]
    expected = beam(encoded, 3, 1.0, False, None)
    text = lm.generate(PROMPTS[2], max_length=len(encoded) + NEW_TOKENS, sampler="beam", num_beams=3,
                       stop_token_ids=None)
    assert text == tokenizer.decode(expected)


def test_one_beam_is_greedy(lm):
    greedy = lm.generate(PROMPTS, max_new_tokens=NEW_TOKENS, stop_token_ids=None)
    assert lm.generate(PROMPTS, max_new_tokens=NEW_TOKENS, stop_token_ids=None, sampler="beam", num_beams=1) == greedy


def test_beam_options_are_checked(lm):
    with pytest.raises(ValueError, match="num_beams must be a positive integer"):
        lm.generate("the cat", max_new_tokens=2, sampler="beam", num_beams=0)
    with pytest.raises(ValueError, match="early_stopping must be"):
        lm.generate("the cat", max_new_tokens=2, sampler="beam", early_stopping="sometimes")
    with pytest.raises(ValueError, match="Beam search takes the options"):
        lm.generate("the cat", max_new_tokens=2, sampler="beam", temperature=0.5)
