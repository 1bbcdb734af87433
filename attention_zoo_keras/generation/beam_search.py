"""Beam search with a length penalty, in fixed shapes for a compiled loop.

Each prompt keeps `K = num_beams` running hypotheses scored by their summed
log-probabilities. At each step every running beam proposes every token;
the best `2K` (or more, with several stop tokens) candidates are kept:

* the best `K` candidates that did not just end continue as the running beams
  (their caches — key/value caches or recurrent states, batch first — are
  gathered from their parent beams);
* candidates among the best `K` that end — with a stop token, or at the
  maximum length — join the finished hypotheses with the score

      score(y) = log p(y | x) / |y|^length_penalty

  where `|y|` counts the generated tokens (stop token included), and the
  best `K` finished hypotheses are kept.

Decoding stops once no running beam can still beat the worst finished one
(`early_stopping=False`: judged at the current length; `"never"`: at the
longest reachable length when `length_penalty > 0`), as soon as `K`
hypotheses have finished (`early_stopping=True`), or at the maximum length.
These are the rules of `transformers`' beam search (4.50+), so the best
hypothesis is the same. The length penalty is Wu et al. (2016), "Google's
Neural Machine Translation System", in its simple `|y|^α` form.
"""

import numbers
from typing import NamedTuple

import keras
from keras import ops

from attention_zoo_keras.backend_support import reorder_rows
from attention_zoo_keras.generation.cache_growth import run_with_growing_cache
from attention_zoo_keras.generation.decoding_controls import DecodingHistory

_NEG = -1.0e9


class BeamOptions(NamedTuple):
    """How `beam_search` searches: `num_beams` hypotheses per prompt, scored
    with `length_penalty`, stopped by `early_stopping` (see the module
    docstring). Hashable, so that it keys a compiled program."""

    num_beams: int = 4
    length_penalty: float = 1.0
    early_stopping: object = False


def check_beam_options(num_beams, length_penalty, early_stopping):
    """Validates the options; returns them normalised, as `BeamOptions`."""
    if isinstance(num_beams, bool) or not isinstance(num_beams, numbers.Real) or not float(num_beams).is_integer() \
            or num_beams < 1:
        raise ValueError(f"num_beams must be a positive integer; got {num_beams!r}.")
    if isinstance(length_penalty, bool) or not isinstance(length_penalty, numbers.Real):
        raise ValueError(f"length_penalty must be a number; got {length_penalty!r}.")
    if not (isinstance(early_stopping, bool) or early_stopping == "never"):
        raise ValueError(f"early_stopping must be True, False or 'never'; got {early_stopping!r}.")
    return BeamOptions(int(num_beams), float(length_penalty), early_stopping)


def _gather_beams(tensor, indices):
    """`tensor[b, indices[b, j], ...]`: `(batch, n, ...)` → `(batch, m, ...)`."""
    extra = len(ops.shape(tensor)) - 2
    expanded = ops.reshape(indices, ops.shape(indices) + (1,) * extra)
    return ops.take_along_axis(tensor, ops.broadcast_to(expanded, ops.shape(indices) + ops.shape(tensor)[2:]), axis=1)


def beam_search_body(step, options, process_log_probs=None):
    """The search's body: `body(index, running, running_scores,
    running_token_scores, finished, finished_scores, finished_token_scores,
    finished_lengths, is_finished, improvable, all_ended, cache, fixed)`
    extends every running beam by position `index` and returns the same
    tuple (without `fixed`) for `index + 1`. `*_token_scores` `(batch, K,
    buffer_length)` hold each hypothesis' per-token log-probabilities (as
    processed).

    `fixed` is `(prompt_length, max_length, row_end_positions,
    stop_token_ids, constants)` (see `beam_search`): every tensor the body
    reads is an argument, so a recording of it serves every call.

    Args:
        step: callable. `step(token_ids (batch·K, 1), cache, index,
            *constants) -> (logits (batch·K, vocabulary), cache)`, the model
            on the token at `index` given a cache of every earlier position.
        options: BeamOptions. The search's options (see the module
            docstring).
        process_log_probs: callable or None. Optionally
            `process_log_probs(log_probs (batch·K, vocabulary), history) ->
            log_probs` (`history` a `decoding_controls.DecodingHistory` of
            the `batch·K` running beams), applied to each step's
            log-probabilities of the token after position
            `history.last_index` before they add to the beams' scores (as
            `transformers` applies its logits processors in beam search:
            e.g. suppressed tokens at −∞, not renormalised).
    """
    beams, length_penalty, early_stopping = options

    def search_one(index, running, running_scores, running_token_scores, finished, finished_scores,
                   finished_token_scores, finished_lengths, is_finished, improvable, all_ended, cache, fixed):
        prompt_length, max_length, row_end_positions, stop_token_ids, constants = fixed
        batch, _, buffer_length = ops.shape(running)
        keep = _kept_candidates(beams, ops.shape(stop_token_ids)[0])
        positions = ops.arange(buffer_length, dtype="int32")
        in_top_beams = ops.arange(keep) < beams
        previous = ops.reshape(ops.take(running, ops.reshape(index - 1, (1,)), axis=2), (batch * beams, 1))
        logits, cache = step(previous, cache, index - 1, *constants)
        log_probs = ops.log_softmax(ops.cast(logits, "float32"), axis=-1)
        if process_log_probs is not None:
            history = DecodingHistory(
                ops.reshape(running, (batch * beams, buffer_length)), index - 1, prompt_length, row_end_positions,
                stop_token_ids,
            )
            log_probs = process_log_probs(log_probs, history)
        vocabulary = ops.shape(log_probs)[-1]
        step_scores = ops.reshape(log_probs, (batch, beams * vocabulary))
        totals = ops.reshape(log_probs, (batch, beams, vocabulary)) + running_scores[:, :, None]
        top_scores, top_indices = ops.top_k(ops.reshape(totals, (batch, beams * vocabulary)), k=keep)
        parents = ops.cast(top_indices // vocabulary, "int32")
        tokens = ops.cast(top_indices % vocabulary, "int32")
        is_index = positions[None, None, :] == index
        candidates = ops.where(is_index, tokens[:, :, None], _gather_beams(running, parents))
        token_scores = ops.take_along_axis(step_scores, top_indices, axis=1)
        candidate_token_scores = ops.where(
            is_index, token_scores[:, :, None], _gather_beams(running_token_scores, parents)
        )
        is_stop = ops.any(ops.equal(tokens[:, :, None], stop_token_ids[None, None, :]), axis=-1)
        ended = ops.logical_or(is_stop, ops.greater_equal(index + 1, max_length))

        # Running beams: the best candidates that did not end.
        running_candidate_scores = top_scores + ops.cast(ended, "float32") * _NEG
        _, next_indices = ops.top_k(running_candidate_scores, k=beams)
        running = _gather_beams(candidates, next_indices)
        running_scores = _gather_beams(running_candidate_scores, next_indices)
        running_token_scores = _gather_beams(candidate_token_scores, next_indices)
        rows = ops.reshape(_gather_beams(parents, next_indices) + ops.arange(batch, dtype="int32")[:, None] * beams, (-1,))
        cache = keras.tree.map_structure(lambda tensor: reorder_rows(tensor, rows), cache)

        # Finished hypotheses: the best K so far, with the length penalty.
        just_finished = ops.logical_and(ended, in_top_beams[None, :])
        generated = index + 1 - prompt_length
        candidate_scores = _penalised(top_scores, generated, length_penalty)
        closed = ops.logical_not(improvable)
        if early_stopping is True:
            closed = ops.logical_or(closed, ops.all(is_finished, axis=-1, keepdims=True))
        candidate_scores = candidate_scores + ops.cast(closed, "float32") * _NEG
        candidate_scores = candidate_scores + ops.cast(ops.logical_not(just_finished), "float32") * _NEG
        merged_scores = ops.concatenate([finished_scores, candidate_scores], axis=1)
        _, best = ops.top_k(merged_scores, k=beams)
        finished = _gather_beams(ops.concatenate([finished, candidates], axis=1), best)
        finished_scores = _gather_beams(merged_scores, best)
        finished_token_scores = _gather_beams(
            ops.concatenate([finished_token_scores, candidate_token_scores], axis=1), best
        )
        candidate_lengths = ops.broadcast_to(index + 1, (batch, keep))
        finished_lengths = _gather_beams(ops.concatenate([finished_lengths, candidate_lengths], axis=1), best)
        is_finished = _gather_beams(ops.concatenate([is_finished, just_finished], axis=1), best)

        # Can a running beam still beat the worst finished hypothesis?
        index = index + 1
        if early_stopping == "never" and length_penalty > 0.0:
            best_length = max_length - prompt_length
        else:
            best_length = index - prompt_length
        best_running = _penalised(running_scores[:, :1], best_length, length_penalty)
        worst_finished = ops.where(is_finished, ops.min(finished_scores, axis=1, keepdims=True), _NEG)
        improvable = ops.logical_and(improvable, ops.any(best_running > worst_finished, axis=-1, keepdims=True))
        return (index, running, running_scores, running_token_scores, finished, finished_scores,
                finished_token_scores, finished_lengths, is_finished, improvable, ops.all(ended), cache)

    return search_one


def _kept_candidates(beams, num_stop):
    """Candidates kept per step: `2K`, or more with several stop tokens (so
    that `K` running beams remain however many candidates end)."""
    return max(2, 1 + num_stop) * beams


def _penalised(score, generated_length, length_penalty):
    return score / ops.power(ops.cast(generated_length, "float32"), length_penalty)


def beam_search(body, state, options, cache_growth=None):
    """Best continuation of each prompt (all prompts the same length).

    Args:
        body: callable. A `beam_search_body` (or a recording of one).
        state: DecodingState. `token_ids` `(batch, buffer_length)` int32,
            the prompts in `[:, :start_index]` and the pad id after;
            `end_positions` `(batch,)`, of which the largest is the longest
            total length; `stop_token_ids`; `start_index`, the length of
            every prompt; `cache`, the model's cache for `batch · K` rows
            (each prompt's rows consecutive) holding positions
            `[0, start_index − 1)` (a position-addressed cache may hold
            more); the first step feeds position `start_index − 1`; and the
            `constants` the step takes. Its `prompt_mask` is not used.
        options: BeamOptions. The search's options (see the module
            docstring).
        cache_growth: CacheGrowth or None. How the cache grows with the
            positions written (`cache_growth.run_with_growing_cache`), or
            `None` for a cache that keeps the buffer's size.

    Returns:
        `(token_ids, lengths, token_scores, sequence_scores)`: the best
        hypothesis per prompt `(batch, buffer_length)` (the pad id after its
        end), its total length `(batch,)`, its tokens' log-probabilities
        `(batch, buffer_length)` (0 on the prompt; as processed, what
        `transformers`' `compute_transition_scores` gives with
        `beam_indices`) and its score with the length penalty `(batch,)`
        (`transformers`' `sequences_scores`).
    """
    token_ids, stop_token_ids = state.token_ids, state.stop_token_ids
    beams, early_stopping = options.num_beams, options.early_stopping
    batch = ops.shape(token_ids)[0]
    prompt_length = ops.cast(state.start_index, "int32")
    max_length = ops.cast(ops.max(state.end_positions), "int32")
    row_end_positions = ops.repeat(ops.cast(state.end_positions, "int32"), beams, axis=0)
    fixed = (prompt_length, max_length, row_end_positions, stop_token_ids, tuple(state.constants))

    def search_until(loop_state, until):
        limit = ops.minimum(max_length, until)

        def keep_going(index, running, running_scores, running_token_scores, finished, finished_scores,
                       finished_token_scores, finished_lengths, is_finished, improvable, all_ended, cache):
            go = ops.logical_and(ops.any(improvable), ops.logical_not(all_ended))
            if early_stopping is True:
                go = ops.logical_and(go, ops.logical_not(ops.all(is_finished)))
            return ops.logical_and(go, ops.less(index, limit))

        return ops.while_loop(keep_going, lambda *loop_state: body(*loop_state, fixed), loop_state)

    running = ops.repeat(token_ids[:, None, :], beams, axis=1)
    running_scores = ops.concatenate(
        [ops.zeros((batch, 1)), ops.full((batch, beams - 1), _NEG)], axis=1
    )
    token_scores = ops.zeros(ops.shape(running), "float32")
    loop_state = (
        prompt_length,
        running,
        running_scores,
        token_scores,
        running,
        ops.full((batch, beams), _NEG),
        token_scores,
        ops.broadcast_to(prompt_length, (batch, beams)),
        ops.zeros((batch, beams), dtype="bool"),
        ops.ones((batch, 1), dtype="bool"),
        ops.convert_to_tensor(False),
        state.cache,
    )
    # A step reads the cache (attention), then copies it to reorder the beams (a read and a write).
    loop_state = run_with_growing_cache(
        search_until, loop_state, token_ids, state.start_index_bound, cache_growth, reads_per_step=3
    )
    _, _, _, _, finished, finished_scores, finished_token_scores, finished_lengths = loop_state[:8]
    return finished[:, 0, :], finished_lengths[:, 0], finished_token_scores[:, 0, :], finished_scores[:, 0]
