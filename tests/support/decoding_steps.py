"""Helpers of the decoding-step export tests: a tiny GPT, and greedy decoding
run through a step function token by token, checked at every position
against the Keras model's full forward pass."""

import keras
import numpy as np

import attention_zoo_keras as azk
from tests.support.gpt_decoding import full_logits
from tests.support.tiny_models import tiny_gpt

PROMPT = [5, 17, 3, 29]
NEW_TOKENS = 5
MAX_LENGTH = 16


def step_lm(**overrides):
    """A tiny `GPTCausalLM` with seeded random weights."""
    keras.utils.set_random_seed(3)
    return azk.models.GPTCausalLM(tiny_gpt(**overrides))


def decode_with_step(run, cache, lm):
    """Feeds `PROMPT`, then greedy choices, one token per call of `run`
    (`{name: array} -> {name: array}`, the step's inputs and outputs),
    carrying the cache; checks each step's logits against a full pass
    (1e-4). Returns the tokens."""
    ids = list(PROMPT)
    for position in range(len(PROMPT) + NEW_TOKENS - 1):
        outputs = run({"token_ids": np.array([[ids[position]]], "int32"), "index": np.array([position], "int32"),
                       **cache})
        cache = {name: value for name, value in outputs.items() if name != "logits"}
        expected = full_logits(lm, [ids[: position + 1]])[0, -1]  # the token after them, by one full pass
        np.testing.assert_allclose(outputs["logits"][0], expected, atol=1e-4)
        if position >= len(PROMPT) - 1:
            ids.append(int(np.argmax(outputs["logits"][0])))
    return ids


def generated_tokens(lm):
    """`generate`'s greedy tokens after `PROMPT` (no stop token)."""
    return lm.generate({"token_ids": [PROMPT]}, max_new_tokens=NEW_TOKENS, stop_token_ids=None)["token_ids"][0].tolist()
