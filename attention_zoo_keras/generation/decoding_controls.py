"""The decoding controls of `generate`: rules that change each step's
scores before a token is chosen, with the meanings `transformers` gives
them (its logits processors of the same names).

At the step that chooses the token after position `t`, row `b` has the
tokens `y[b, 0..t]` (its prompt, then what it generated) and the scores
`s` over the vocabulary (logits when sampling, log-probabilities in beam
search, as `transformers` applies them):

* `repetition_penalty` `p` (Keskar et al. 2019, "CTRL: A Conditional
  Transformer Language Model for Controllable Generation"): for every id
  `v` among `y[b, 0..t]`, `s_v ← s_v · p` if `s_v < 0`, else `s_v / p`;
* `no_repeat_ngram_size` `n`: `s_v ← −∞` for every `v` such that the
  n-gram `(y[b, t−n+2..t], v)` already occurs in `y[b, 0..t]`;
* `bad_words_ids`: `s_v ← −∞` for each banned sequence `(w_1..w_m, v)`
  whose prefix `w_1..w_m` ends `y[b, 0..t]` (`m = 0`: always). As in
  `transformers`, a one-id sequence that is a stop id is not banned;
* `min_new_tokens` `k`: `s_v ← −∞` for the stop ids while row `b` has
  generated fewer than `k` tokens (`t + 1 − prompt_length[b] < k`).

The penalty applies first; the bans commute. Each rule reads the token
buffer through tensor indices and fixed-width slices only, so it compiles
into the decoding loop on every backend (and records under torch):
a rule costs a scatter of `rows × length` ids (`marked_columns`) or a
comparison of `rows × length × n` ids per step, never a pass per id.
Padding and the positions after `t` are never read as tokens.
"""

import numbers
from typing import Any
from typing import NamedTuple

from keras import ops

from attention_zoo_keras.backend_support import fill_columns
from attention_zoo_keras.backend_support import marked_columns
from attention_zoo_keras.generation.generate_arguments import check_count

_BANNED = float("-inf")
# What a rule writes where it bans no id.
_NO_ID = -1


class DecodingControls(NamedTuple):
    """The controls of one `generate` call, normalised and hashable (they
    key the compiled loop). The defaults change nothing.

    Attributes:
        min_new_tokens: int. Stop ids are banned before this many tokens.
        repetition_penalty: float. 1.0 for none.
        no_repeat_ngram_size: int. 0 for none.
        bad_words_ids: tuple of tuples of int. Banned id sequences.
    """

    min_new_tokens: int = 0
    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0
    bad_words_ids: tuple = ()

    @property
    def active(self):
        """Whether any control changes the scores."""
        return self != DecodingControls()


class DecodingHistory(NamedTuple):
    """What a step's score rules read besides the scores (the controls, and
    a task's own rules, such as a forced end token).

    Attributes:
        token_ids: int32 tensor of shape `(rows, buffer_length)`. Each
            row's tokens; positions after `last_index` are not read.
        last_index: int32 scalar tensor. The position of the last known
            token (the step chooses the token after it).
        prompt_lengths: int32 tensor broadcastable to `(rows,)`. Each row's
            prompt length.
        end_positions: int32 tensor of shape `(rows,)`. Row `r` writes no
            position at or past `end_positions[r]`.
        stop_token_ids: int32 tensor of shape `(num_stop,)`. The stop ids
            (`-1` for none).
    """

    token_ids: Any
    last_index: Any
    prompt_lengths: Any
    end_positions: Any
    stop_token_ids: Any


def _check_bad_words(bad_words_ids, stop_ids):
    if bad_words_ids is None:
        return ()
    message = f"bad_words_ids must be a non-empty list of non-empty lists of token ids; got {bad_words_ids!r}."
    if isinstance(bad_words_ids, (str, bytes)) or not hasattr(bad_words_ids, "__iter__"):
        raise TypeError(message)
    words = list(bad_words_ids)
    if not words or any(isinstance(word, (str, bytes)) or not hasattr(word, "__iter__") for word in words):
        raise TypeError(message)
    words = [tuple(word) for word in words]
    if any(not word for word in words) or any(
        isinstance(i, bool) or not isinstance(i, numbers.Integral) for word in words for i in word
    ):
        raise TypeError(message)
    words = tuple(tuple(int(i) for i in word) for word in words)
    return tuple(word for word in words if not (len(word) == 1 and word[0] in stop_ids))


def decoding_controls(
    stop_ids,
    min_new_tokens=None,
    repetition_penalty=None,
    no_repeat_ngram_size=None,
    bad_words_ids=None,
):
    """`DecodingControls` from `generate`'s arguments, checked.

    Args:
        stop_ids: tuple of int. The call's stop ids.
        min_new_tokens: int or None. See the module docstring.
        repetition_penalty: float or None. Positive.
        no_repeat_ngram_size: int or None. Non-negative (0: none).
        bad_words_ids: list of lists of int, or None.

    Raises:
        TypeError, ValueError: naming the argument and the problem. (The
            caller checks that the ids are in its vocabulary.)
    """
    penalty = 1.0 if repetition_penalty is None else repetition_penalty
    if isinstance(penalty, bool) or not isinstance(penalty, numbers.Real):
        raise TypeError(f"repetition_penalty must be a number or None; got {repetition_penalty!r}.")
    if not penalty > 0:
        raise ValueError(f"repetition_penalty must be positive (1.0: no penalty); got {repetition_penalty}.")
    return DecodingControls(
        check_count("min_new_tokens", min_new_tokens) or 0,
        float(penalty),
        check_count("no_repeat_ngram_size", no_repeat_ngram_size) or 0,
        _check_bad_words(bad_words_ids, stop_ids),
    )


def apply_controls(controls, scores, history):
    """`scores` `(rows, vocabulary)` float32 with `controls` applied (see
    the module docstring).

    Args:
        controls: DecodingControls. The call's controls.
        scores: float32 tensor of shape `(rows, vocabulary)`. The step's
            scores for the token after `history.last_index`; a fresh tensor
            the caller owns (under torch the banned single ids are written
            into it in place, `backend_support.fill_columns`).
        history: DecodingHistory. The rows' tokens so far.
    """
    if controls.repetition_penalty != 1.0:
        scores = _penalize_repetitions(scores, history, controls.repetition_penalty)
    banned = []
    if controls.no_repeat_ngram_size:
        banned.append(_repeated_ngram_ends(history, controls.no_repeat_ngram_size))
    if controls.bad_words_ids:
        banned.extend(_bad_word_ends(history, controls.bad_words_ids))
    vocabulary = ops.shape(scores)[-1]
    if banned:
        ids = ops.concatenate(banned, axis=1)
        marked = marked_columns(ops.where(ids == _NO_ID, vocabulary, ids), vocabulary)
        scores = ops.where(marked, _BANNED, scores)
    single_ids = [word[0] for word in controls.bad_words_ids if len(word) == 1]
    if single_ids:
        scores = fill_columns(scores, single_ids, _BANNED)
    if controls.min_new_tokens:
        scores = _ban_stops_before(scores, history, controls.min_new_tokens)
    return scores


def _known(history):
    """Bool `(1, buffer_length)`: the positions up to `last_index`."""
    length = ops.shape(history.token_ids)[1]
    return ops.less_equal(ops.arange(length, dtype="int32"), history.last_index)[None, :]


def _penalize_repetitions(scores, history, penalty):
    vocabulary = ops.shape(scores)[-1]
    present = marked_columns(ops.where(_known(history), history.token_ids, vocabulary), vocabulary)
    penalized = ops.where(scores < 0, scores * penalty, scores / penalty)
    return ops.where(present, penalized, scores)


def _tokens_before(history, count):
    """Int32 `(rows, count)`: the tokens at `last_index − count + 1 ..
    last_index` (positions before 0 read position 0; callers mask them)."""
    positions = ops.maximum(history.last_index - count + 1 + ops.arange(count, dtype="int32"), 0)
    return ops.take(history.token_ids, positions, axis=1)


def _repeated_ngram_ends(history, n):
    """Int32 `(rows, windows)`: for each n-gram window of the known tokens
    whose first `n − 1` ids are the last `n − 1` known ids, its last id;
    `_NO_ID` elsewhere."""
    token_ids = history.token_ids
    length = ops.shape(token_ids)[1]
    windows = length - n + 1
    if windows < 1:
        return ops.full((ops.shape(token_ids)[0], 0), _NO_ID, "int32")
    starts = ops.arange(windows, dtype="int32")
    complete = ops.less_equal(starts + n - 1, history.last_index)[None, :]
    matches = complete
    if n > 1:
        suffix = _tokens_before(history, n - 1)
        for k in range(n - 1):
            matches = ops.logical_and(matches, ops.equal(token_ids[:, k : k + windows], suffix[:, k : k + 1]))
    return ops.where(matches, token_ids[:, n - 1 : n - 1 + windows], _NO_ID)


def _bad_word_ends(history, bad_words_ids):
    """For each banned sequence of two or more ids: int32 `(rows, 1)`, its
    last id where a row ends with its prefix, `_NO_ID` elsewhere."""
    ends = []
    for word in bad_words_ids:
        prefix = word[:-1]
        if not prefix:
            continue
        recent = _tokens_before(history, len(prefix))
        matches = ops.all(ops.equal(recent, ops.convert_to_tensor(prefix, "int32")[None, :]), axis=1, keepdims=True)
        matches = ops.logical_and(matches, ops.greater_equal(history.last_index + 1, len(prefix)))
        ends.append(ops.where(matches, word[-1], _NO_ID))
    return ends


def _ban_stops_before(scores, history, min_new_tokens):
    generated = history.last_index + 1 - history.prompt_lengths
    too_early = ops.less(ops.broadcast_to(generated, (ops.shape(scores)[0],)), min_new_tokens)[:, None]
    vocabulary = ops.arange(ops.shape(scores)[-1], dtype="int32")
    is_stop = ops.any(vocabulary[:, None] == history.stop_token_ids[None, :], axis=-1)[None, :]
    return ops.where(ops.logical_and(too_early, is_stop), _BANNED, scores)
