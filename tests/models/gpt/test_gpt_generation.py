"""Greedy generation with a key/value cache: cached logits against full
forward passes, and token-for-token against `transformers`' `generate`."""

import keras
import numpy as np
import pytest
import torch
import transformers

from attention_zoo_keras.models.gpt import GPTCausalLM
from tests.support.gpt_decoding import PROMPTS
from tests.support.gpt_decoding import right_padded

ATOL = 1e-4


@pytest.fixture(scope="module")
def lm(tiny_gpt2_checkpoints):
    return GPTCausalLM.from_preset(str(tiny_gpt2_checkpoints["lm"]))


def test_cached_logits_match_full_forward(lm):
    rng = np.random.default_rng(0)
    batch, length = 3, 12
    token_ids = rng.integers(1, lm.backbone.vocabulary_size, size=(batch, length)).astype("int32")
    full = keras.ops.convert_to_numpy(
        lm({"token_ids": token_ids, "padding_mask": np.ones_like(token_ids)})
    )

    # A chunk first (the prompt), then one token at a time.
    cache = lm.init_cache(batch, length)
    prefix = 4
    logits, hidden, cache = lm.call_with_cache(token_ids[:, :prefix], cache, 0)
    assert tuple(hidden.shape) == (batch, prefix, lm.backbone.hidden_dim)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(logits), full[:, :prefix], atol=ATOL)
    for index in range(prefix, length):
        logits, _, cache = lm.call_with_cache(token_ids[:, index : index + 1], cache, index)
        np.testing.assert_allclose(keras.ops.convert_to_numpy(logits)[:, 0], full[:, index], atol=ATOL)

    # With an explicit padding mask over the cache (all filled so far).
    cache = lm.init_cache(batch, length)
    mask = np.ones((batch, length), "int32")
    for index in range(length):
        logits, _, cache = lm.call_with_cache(token_ids[:, index : index + 1], cache, index, padding_mask=mask)
        np.testing.assert_allclose(keras.ops.convert_to_numpy(logits)[:, 0], full[:, index], atol=ATOL)


def _reference(path, prompts, max_new_tokens, eos_token_id=None):
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.GPT2LMHeadModel.from_pretrained(path).eval()
    outputs = []
    for prompt in prompts:
        input_ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            output = model.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                do_sample=False,
                max_new_tokens=max_new_tokens,
                pad_token_id=tokenizer.eos_token_id,
                eos_token_id=eos_token_id,
            )
        outputs.append(output[0].tolist())
    return outputs, tokenizer


def test_greedy_generation_matches_transformers(lm, tiny_gpt2_checkpoints):
    path = tiny_gpt2_checkpoints["lm"]
    new = 6
    expected, tokenizer = _reference(path, PROMPTS, new)
    prompt_lengths = {len(tokenizer(p)["input_ids"]) for p in PROMPTS}
    assert len(prompt_lengths) > 2  # really different lengths

    # Token ids in, token ids out.
    encoded = [tokenizer(p)["input_ids"] for p in PROMPTS]
    token_ids, padding_mask = right_padded(encoded)
    result = lm.generate(
        {"token_ids": token_ids, "padding_mask": padding_mask}, max_new_tokens=new, stop_token_ids=None
    )
    for row, reference in enumerate(expected):
        ours = result["token_ids"][row][result["padding_mask"][row].astype(bool)].tolist()
        assert ours == reference, f"prompt {row}"

    # Strings in, strings out.
    texts = lm.generate(PROMPTS, max_new_tokens=new, stop_token_ids=None)
    assert texts == [tokenizer.decode(ids, skip_special_tokens=True) for ids in expected]
    assert lm.generate(PROMPTS[1], max_new_tokens=new, stop_token_ids=None) == texts[1]


def test_max_length_pads_every_row_to_the_same_total(lm, tiny_gpt2_checkpoints):
    path = tiny_gpt2_checkpoints["lm"]
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    encoded = [tokenizer(p)["input_ids"] for p in PROMPTS]
    max_length = max(map(len, encoded)) + 3
    expected = [
        _reference(path, [p], max_length - len(ids))[0][0] for p, ids in zip(PROMPTS, encoded)
    ]
    token_ids, padding_mask = right_padded(encoded)
    result = lm.generate(
        {"token_ids": token_ids, "padding_mask": padding_mask}, max_length=max_length, stop_token_ids=None
    )
    assert result["token_ids"].shape == (len(PROMPTS), max_length)
    assert result["padding_mask"].all()
    assert result["token_ids"].tolist() == expected


def test_stop_tokens_end_rows(lm, tiny_gpt2_checkpoints):
    path = tiny_gpt2_checkpoints["lm"]
    expected, tokenizer = _reference(path, PROMPTS, 10)
    # Pick as stop token the first generated token of prompt 0: that row stops
    # right after it; the others stop at their first occurrence of it, if any.
    encoded = [tokenizer(p)["input_ids"] for p in PROMPTS]
    stop = expected[0][len(encoded[0])]
    token_ids, padding_mask = right_padded(encoded)
    result = lm.generate(
        {"token_ids": token_ids, "padding_mask": padding_mask}, max_new_tokens=10, stop_token_ids=[stop]
    )
    for row, reference in enumerate(expected):
        generated = reference[len(encoded[row]) :]
        if stop in generated:
            generated = generated[: generated.index(stop) + 1]
        ours = result["token_ids"][row][result["padding_mask"][row].astype(bool)].tolist()
        assert ours == encoded[row] + generated, f"prompt {row}"


def test_generation_errors(lm):
    with pytest.raises(ValueError, match="Prompt 1 is empty"):
        lm.generate(["the cat", ""], max_new_tokens=2)
    with pytest.raises(ValueError, match="max_length 2 is shorter than the longest prompt"):
        lm.generate(["the cat sat on the mat"], max_length=2)
    with pytest.raises(ValueError, match="not both"):
        lm.generate(["the cat"], max_length=8, max_new_tokens=2)
    with pytest.raises(ValueError, match="exceeds the model's max_sequence_length"):
        lm.generate(["the cat"], max_new_tokens=100)
    with pytest.raises(ValueError, match="not right-padded"):
        lm.generate({"token_ids": np.array([[0, 5, 6]]), "padding_mask": np.array([[0, 1, 1]])}, max_new_tokens=2)
