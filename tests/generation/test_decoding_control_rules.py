"""The decoding controls' rules (`generation.decoding_controls`) against
`transformers`' logits processors of the same names, applied to the same
random scores and token histories: equal results, ids banned at −∞, on
every backend. The rows' histories are read from a longer buffer at
`last_index`, as the decoding loop reads them, with other ids after it."""

import keras
import numpy as np
import pytest
import torch
import transformers

from attention_zoo_keras import backend_support
from attention_zoo_keras.generation.decoding_controls import DecodingHistory
from attention_zoo_keras.generation.decoding_controls import apply_controls
from attention_zoo_keras.generation.decoding_controls import decoding_controls

VOCABULARY = 11
STOP_IDS = (3, 7)


def _histories(seed, rows=4, known=9, buffer_length=14):
    """Token rows of `known` ids from a small alphabet (so n-grams and
    words repeat) in a longer buffer, and random scores of both signs."""
    rng = np.random.default_rng(seed)
    token_ids = rng.integers(0, VOCABULARY, size=(rows, buffer_length)).astype("int32")
    token_ids[:, :known] = rng.integers(0, 4, size=(rows, known))
    scores = rng.normal(size=(rows, VOCABULARY)).astype("float32")
    return token_ids, scores


def _ours(controls, token_ids, scores, last_index, prompt_lengths):
    history = DecodingHistory(
        keras.ops.convert_to_tensor(token_ids),
        keras.ops.convert_to_tensor(np.int32(last_index)),
        keras.ops.convert_to_tensor(np.asarray(prompt_lengths, "int32")),
        keras.ops.convert_to_tensor(np.full(len(token_ids), 99, "int32")),
        keras.ops.convert_to_tensor(np.array(STOP_IDS, "int32")),
    )
    fresh_scores = keras.ops.convert_to_tensor(scores.copy())  # (apply_controls may write into it)
    return keras.ops.convert_to_numpy(apply_controls(controls, fresh_scores, history))


def _theirs(processor, token_ids, scores, last_index):
    known = torch.tensor(token_ids[:, : last_index + 1], dtype=torch.long)
    return processor(known, torch.tensor(scores)).numpy()


@pytest.mark.parametrize("penalty", [1.7, 0.6])
def test_repetition_penalty_matches_transformers(penalty):
    token_ids, scores = _histories(0)
    controls = decoding_controls(STOP_IDS, repetition_penalty=penalty)
    expected = _theirs(transformers.RepetitionPenaltyLogitsProcessor(penalty), token_ids, scores, 8)
    np.testing.assert_allclose(_ours(controls, token_ids, scores, 8, [3] * 4), expected, rtol=1e-6)
    assert not np.allclose(expected, scores)


@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("last_index", [0, 1, 8])
def test_no_repeat_ngram_matches_transformers(n, last_index):
    token_ids, scores = _histories(1)
    controls = decoding_controls(STOP_IDS, no_repeat_ngram_size=n)
    expected = _theirs(transformers.NoRepeatNGramLogitsProcessor(n), token_ids, scores, last_index)
    np.testing.assert_array_equal(_ours(controls, token_ids, scores, last_index, [1] * 4), expected)
    if last_index == 8:
        assert np.isinf(expected).any()  # something was banned


@pytest.mark.parametrize("last_index", [0, 2, 8])
def test_bad_words_match_transformers(last_index):
    token_ids, scores = _histories(2)
    # A one-id word, a stop id alone (ignored, as in transformers), and words whose prefixes occur.
    words = [[5], [STOP_IDS[0]], [int(token_ids[0, last_index]), 9], [int(token_ids[1, last_index - 1]),
             int(token_ids[1, last_index]), 10], [1, 2, 3, 4, 6]]
    controls = decoding_controls(STOP_IDS, bad_words_ids=words)
    processor = transformers.NoBadWordsLogitsProcessor(words, eos_token_id=list(STOP_IDS))
    expected = _theirs(processor, token_ids, scores, last_index)
    np.testing.assert_array_equal(_ours(controls, token_ids, scores, last_index, [1] * 4), expected)
    assert np.isneginf(expected[0, 9]) and not np.isneginf(expected[:, STOP_IDS[0]]).any()


def test_min_new_tokens_counts_each_rows_own_prompt():
    """Rows with prompts of 2, 5, 6 and 9 tokens at `last_index` 7 have
    generated 6, 3, 2 and 0 tokens: with a minimum of 3, the last two may
    not stop yet. transformers (one prompt length per call) agrees row by
    row."""
    token_ids, scores = _histories(3)
    prompt_lengths = [2, 5, 6, 9]
    controls = decoding_controls(STOP_IDS, min_new_tokens=3)
    ours = _ours(controls, token_ids, scores, 7, prompt_lengths)
    for row, length in enumerate(prompt_lengths):
        processor = transformers.MinNewTokensLengthLogitsProcessor(length, 3, list(STOP_IDS))
        np.testing.assert_array_equal(ours[row], _theirs(processor, token_ids, scores, 7)[row])
    assert np.isneginf(ours[2:, list(STOP_IDS)]).all() and np.isfinite(ours[:2]).all()


def test_all_controls_together_match_transformers_in_its_order():
    token_ids, scores = _histories(4)
    words = [[5], [int(token_ids[0, 7]), int(token_ids[0, 8]), 9]]
    controls = decoding_controls(
        STOP_IDS, min_new_tokens=4, repetition_penalty=1.3, no_repeat_ngram_size=2, bad_words_ids=words
    )
    processors = transformers.LogitsProcessorList([
        transformers.RepetitionPenaltyLogitsProcessor(1.3),
        transformers.NoRepeatNGramLogitsProcessor(2),
        transformers.NoBadWordsLogitsProcessor(words, eos_token_id=list(STOP_IDS)),
        transformers.MinNewTokensLengthLogitsProcessor(6, 4, list(STOP_IDS)),
    ])
    expected = _theirs(processors, token_ids, scores, 8)
    np.testing.assert_allclose(_ours(controls, token_ids, scores, 8, [6] * 4), expected, rtol=1e-6)


def test_marked_columns_marks_the_named_ids_and_ignores_the_spare_column():
    columns = np.array([[0, 2, 2, 5], [5, 5, 1, 3]], "int32")
    mask = keras.ops.convert_to_numpy(backend_support.marked_columns(keras.ops.convert_to_tensor(columns), 5))
    np.testing.assert_array_equal(mask, [[True, False, True, False, False], [False, True, False, True, False]])


def test_default_controls_change_nothing():
    assert not decoding_controls(STOP_IDS).active
    assert decoding_controls(STOP_IDS, bad_words_ids=[[STOP_IDS[1]]]).bad_words_ids == ()


@pytest.mark.parametrize(
    "arguments,error,message",
    [
        ({"min_new_tokens": -1}, ValueError, "min_new_tokens must be non-negative"),
        ({"min_new_tokens": 2.0}, TypeError, "min_new_tokens must be an int"),
        ({"no_repeat_ngram_size": True}, TypeError, "no_repeat_ngram_size must be an int"),
        ({"repetition_penalty": 0.0}, ValueError, "repetition_penalty must be positive"),
        ({"repetition_penalty": "1.2"}, TypeError, "repetition_penalty must be a number"),
        ({"bad_words_ids": [1, 2]}, TypeError, "bad_words_ids must be a non-empty list of non-empty lists"),
        ({"bad_words_ids": []}, TypeError, "bad_words_ids must be a non-empty list"),
        ({"bad_words_ids": [[1], []]}, TypeError, "bad_words_ids must be a non-empty list of non-empty lists"),
        ({"bad_words_ids": [[1.5]]}, TypeError, "lists of token ids"),
    ],
)
def test_bad_control_values_name_the_argument(arguments, error, message):
    with pytest.raises(error, match=message):
        decoding_controls(STOP_IDS, **arguments)
