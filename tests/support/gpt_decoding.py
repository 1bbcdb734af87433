"""Helpers of the GPT decoding tests (cache, greedy, sampling, beam search):
the generation prompts (`PROMPTS`), right-padding id lists (`right_padded`,
`right_padded_inputs`), and the reference of greedy decoding by full forward
passes with no cache (`full_logits`, `greedy_by_full_passes`)."""

import keras
import numpy as np

PROMPTS = [
    "the cat sat on the mat",
    "a man",
    "the new movie is awesome! the dog",
    "x",
]


def right_padded(encoded):
    """`(token_ids, padding_mask)` of id lists, right-padded with 0."""
    width = max(map(len, encoded))
    token_ids = np.zeros((len(encoded), width), "int32")
    padding_mask = np.zeros((len(encoded), width), "int32")
    for row, ids in enumerate(encoded):
        token_ids[row, : len(ids)] = ids
        padding_mask[row, : len(ids)] = 1
    return token_ids, padding_mask


def right_padded_inputs(prompts):
    """`{"token_ids", "padding_mask"}` of id lists, right-padded with 0."""
    token_ids, padding_mask = right_padded(prompts)
    return {"token_ids": token_ids, "padding_mask": padding_mask}


def numpy(x):
    return keras.ops.convert_to_numpy(x)


def full_logits(lm, token_ids):
    token_ids = np.asarray(token_ids, "int32")
    return numpy(lm({"token_ids": token_ids, "padding_mask": np.ones_like(token_ids)}))


def greedy_by_full_passes(lm, prompt, new_tokens):
    """Greedy decoding by a full forward pass per new token, with no cache.
    Each pass reads a right-padded buffer of one fixed length (a causal model's
    logits at a position do not see later positions), so eager backends
    compile its ops for one shape, not one per length."""
    sequence = list(prompt)
    buffer_length = max(16, len(prompt) + new_tokens)
    for _ in range(new_tokens):
        token_ids = np.zeros((1, buffer_length), "int32")
        token_ids[0, : len(sequence)] = sequence
        padding_mask = (np.arange(buffer_length) < len(sequence)).astype("int32")[None]
        logits = numpy(lm({"token_ids": token_ids, "padding_mask": padding_mask}))[0, len(sequence) - 1]
        assert np.sort(logits)[-1] - np.sort(logits)[-2] > 1e-3  # no near-tie to decide by rounding
        sequence.append(int(np.argmax(logits)))
    return sequence
