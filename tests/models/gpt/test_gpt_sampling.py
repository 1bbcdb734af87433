"""Sampled generation: every drawn token is the draw the sampler's
definition gives on `transformers`' logits at that step, with the uniforms
the seed defines; seeds reproduce; bad sampler arguments are refused."""

import numpy as np
import pytest
import torch
import transformers

from attention_zoo_keras.models.gpt import GPTCausalLM
from tests.support.gpt_decoding import PROMPTS
from tests.support.gpt_decoding import right_padded

NEW_TOKENS = 8


@pytest.fixture(scope="module")
def lm(tiny_gpt2_checkpoints):
    return GPTCausalLM.from_preset(str(tiny_gpt2_checkpoints["lm"]))


def _nucleus_draw(logits, uniform, p, temperature):
    """The top-p draw by its definition, in float64; `None` when `uniform`
    lies too close to a boundary between tokens for float32 to decide."""
    z = logits.astype("float64") / temperature
    probabilities = np.exp(z - z.max())
    probabilities /= probabilities.sum()
    order = np.argsort(-probabilities, kind="stable")
    sorted_p = probabilities[order]
    kept = order[(np.cumsum(sorted_p) - sorted_p) < p]
    cumulative = np.cumsum(probabilities[kept]) / probabilities[kept].sum()
    if np.min(np.abs(cumulative - uniform)) < 1e-4:
        return None
    return int(kept[np.searchsorted(cumulative, uniform, side="right")])


def test_top_p_samples_are_the_reference_draws(lm, tiny_gpt2_checkpoints):
    path = tiny_gpt2_checkpoints["lm"]
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.GPT2LMHeadModel.from_pretrained(path).eval()
    encoded = [tokenizer(p)["input_ids"] for p in PROMPTS[:3]]
    token_ids, padding_mask = right_padded(encoded)
    seed, p, temperature = 7, 0.9, 0.8
    result = lm.generate(
        {"token_ids": token_ids, "padding_mask": padding_mask},
        max_new_tokens=NEW_TOKENS, sampler="top_p", p=p, temperature=temperature, seed=seed,
        stop_token_ids=None,
    )
    total = max(map(len, encoded)) + NEW_TOKENS
    uniforms = np.random.default_rng(seed).random((len(encoded), total), dtype="float32")
    checked = 0
    for row, prompt in enumerate(encoded):
        sequence = result["token_ids"][row][result["padding_mask"][row].astype(bool)].tolist()
        assert sequence[: len(prompt)] == prompt and len(sequence) == len(prompt) + NEW_TOKENS
        with torch.no_grad():
            logits = model(torch.tensor([sequence])).logits[0].numpy()
        for position in range(len(prompt), len(sequence)):
            expected = _nucleus_draw(logits[position - 1], uniforms[row, position], p, temperature)
            if expected is not None:
                assert sequence[position] == expected, f"row {row}, position {position}"
                checked += 1
    assert checked >= 0.9 * len(encoded) * NEW_TOKENS


def test_seeds_reproduce(lm):
    def sample(seed, sampler="temperature", **options):
        return lm.generate(PROMPTS, max_new_tokens=NEW_TOKENS, sampler=sampler, seed=seed,
                           stop_token_ids=None, **options)

    assert sample(1) == sample(1)
    assert sample(1) != sample(2)
    assert sample(3, "top_k", k=5, temperature=0.7) == sample(3, "top_k", k=5, temperature=0.7)
    greedy = lm.generate(PROMPTS, max_new_tokens=NEW_TOKENS, stop_token_ids=None)
    assert sample(4, "top_k", k=1) == greedy
    assert sample(None, "top_p", p=1e-6) == greedy  # a nucleus of one token


def test_sampler_errors(lm):
    with pytest.raises(ValueError, match="Unknown sampler 'nucleus'"):
        lm.generate("the cat", max_new_tokens=2, sampler="nucleus")
    with pytest.raises(ValueError, match=r"Sampler 'top_k' takes the options \['k', 'temperature'\]"):
        lm.generate("the cat", max_new_tokens=2, sampler="top_k", p=0.5)
    with pytest.raises(ValueError, match="outside the valid range"):
        lm.generate({"token_ids": np.array([[3, 5, 100000]])}, max_new_tokens=2)
