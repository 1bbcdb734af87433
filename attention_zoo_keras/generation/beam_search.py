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

import keras
from keras import ops

_NEG = -1.0e9


def check_beam_options(num_beams, length_penalty, early_stopping):
    """Validates the options; returns them normalised."""
    if int(num_beams) != num_beams or num_beams < 1:
        raise ValueError(f"num_beams must be a positive integer; got {num_beams}.")
    if early_stopping not in (True, False, "never"):
        raise ValueError(f"early_stopping must be True, False or 'never'; got {early_stopping!r}.")
    return int(num_beams), float(length_penalty), early_stopping


def _gather_beams(tensor, indices):
    """`tensor[b, indices[b, j], ...]`: `(batch, n, ...)` → `(batch, m, ...)`."""
    extra = len(ops.shape(tensor)) - 2
    expanded = ops.reshape(indices, ops.shape(indices) + (1,) * extra)
    return ops.take_along_axis(tensor, ops.broadcast_to(expanded, ops.shape(indices) + ops.shape(tensor)[2:]), axis=1)


def beam_search(
    step,
    token_ids,
    cache,
    prompt_length,
    max_length,
    stop_token_ids,
    num_beams,
    length_penalty=1.0,
    early_stopping=False,
    constants=(),
    process_log_probs=None,
):
    """Best continuation of each prompt (all prompts the same length).

    Args:
        step: `step(token_ids (batch·K, 1), cache, index, *constants) ->
            (logits (batch·K, vocabulary), cache)`, the model on the token at
            `index` given a cache of every earlier position.
        token_ids: `(batch, buffer_length)` int32: the prompts in
            `[:, :prompt_length]`, the pad id after.
        cache: the model's cache for `batch · K` rows (each prompt's rows
            consecutive), holding positions `[0, prompt_length − 1)` (a
            position-addressed cache may hold more); the first step feeds
            position `prompt_length − 1`.
        prompt_length: int32 scalar, the length of every prompt.
        max_length: int32 scalar ≤ buffer_length, the longest total length.
        stop_token_ids: `(num_stop,)` int32 (`[-1]` for none).
        num_beams, length_penalty, early_stopping: see the module docstring.
        constants: more tensors `step` takes, the same at every step.
        process_log_probs: optionally `process_log_probs(log_probs (batch·K,
            vocabulary), index) -> log_probs`, applied to each step's
            log-probabilities of the token after position `index` before
            they add to the beams' scores (as `transformers` applies its
            logits processors in beam search: e.g. suppressed tokens at −∞,
            not renormalised).

    Returns:
        `(token_ids, lengths)`: the best hypothesis per prompt `(batch,
        buffer_length)` (the pad id after its end) and its total length
        `(batch,)`.
    """
    batch, buffer_length = ops.shape(token_ids)
    beams = num_beams
    num_stop = ops.shape(stop_token_ids)[0]
    keep = max(2, 1 + num_stop) * beams
    prompt_length = ops.cast(prompt_length, "int32")
    max_length = ops.cast(max_length, "int32")
    positions = ops.arange(buffer_length, dtype="int32")
    in_top_beams = ops.arange(keep) < beams

    def penalised(score, generated_length):
        return score / ops.power(ops.cast(generated_length, "float32"), length_penalty)

    def keep_going(index, running, running_scores, finished, finished_scores, finished_lengths,
                   is_finished, improvable, all_ended, cache):
        go = ops.logical_and(ops.any(improvable), ops.logical_not(all_ended))
        if early_stopping is True:
            go = ops.logical_and(go, ops.logical_not(ops.all(is_finished)))
        return ops.logical_and(go, ops.less(index, max_length))

    def search_one(index, running, running_scores, finished, finished_scores, finished_lengths,
                   is_finished, improvable, all_ended, cache):
        previous = ops.reshape(ops.take(running, index - 1, axis=2), (batch * beams, 1))
        logits, cache = step(previous, cache, index - 1, *constants)
        log_probs = ops.log_softmax(ops.cast(logits, "float32"), axis=-1)
        if process_log_probs is not None:
            log_probs = process_log_probs(log_probs, index - 1)
        vocabulary = ops.shape(log_probs)[-1]
        log_probs = ops.reshape(log_probs, (batch, beams, vocabulary)) + running_scores[:, :, None]
        top_scores, top_indices = ops.top_k(ops.reshape(log_probs, (batch, beams * vocabulary)), k=keep)
        parents = ops.cast(top_indices // vocabulary, "int32")
        tokens = ops.cast(top_indices % vocabulary, "int32")
        candidates = _gather_beams(running, parents)
        candidates = ops.where(positions[None, None, :] == index, tokens[:, :, None], candidates)
        is_stop = ops.any(ops.equal(tokens[:, :, None], stop_token_ids[None, None, :]), axis=-1)
        ended = ops.logical_or(is_stop, ops.greater_equal(index + 1, max_length))

        # Running beams: the best candidates that did not end.
        running_candidate_scores = top_scores + ops.cast(ended, "float32") * _NEG
        _, next_indices = ops.top_k(running_candidate_scores, k=beams)
        running = _gather_beams(candidates, next_indices)
        running_scores = _gather_beams(running_candidate_scores, next_indices)
        rows = ops.reshape(_gather_beams(parents, next_indices) + ops.arange(batch, dtype="int32")[:, None] * beams, (-1,))
        cache = keras.tree.map_structure(lambda tensor: ops.take(tensor, rows, axis=0), cache)

        # Finished hypotheses: the best K so far, with the length penalty.
        just_finished = ops.logical_and(ended, in_top_beams[None, :])
        generated = index + 1 - prompt_length
        candidate_scores = penalised(top_scores, generated)
        closed = ops.logical_not(improvable)
        if early_stopping is True:
            closed = ops.logical_or(closed, ops.all(is_finished, axis=-1, keepdims=True))
        candidate_scores = candidate_scores + ops.cast(closed, "float32") * _NEG
        candidate_scores = candidate_scores + ops.cast(ops.logical_not(just_finished), "float32") * _NEG
        merged_scores = ops.concatenate([finished_scores, candidate_scores], axis=1)
        _, best = ops.top_k(merged_scores, k=beams)
        finished = _gather_beams(ops.concatenate([finished, candidates], axis=1), best)
        finished_scores = _gather_beams(merged_scores, best)
        candidate_lengths = ops.broadcast_to(index + 1, (batch, keep))
        finished_lengths = _gather_beams(ops.concatenate([finished_lengths, candidate_lengths], axis=1), best)
        is_finished = _gather_beams(ops.concatenate([is_finished, just_finished], axis=1), best)

        # Can a running beam still beat the worst finished hypothesis?
        index = index + 1
        if early_stopping == "never" and length_penalty > 0.0:
            best_length = max_length - prompt_length
        else:
            best_length = index - prompt_length
        best_running = penalised(running_scores[:, :1], best_length)
        worst_finished = ops.where(is_finished, ops.min(finished_scores, axis=1, keepdims=True), _NEG)
        improvable = ops.logical_and(improvable, ops.any(best_running > worst_finished, axis=-1, keepdims=True))
        return (index, running, running_scores, finished, finished_scores, finished_lengths,
                is_finished, improvable, ops.all(ended), cache)

    running = ops.repeat(token_ids[:, None, :], beams, axis=1)
    running_scores = ops.concatenate(
        [ops.zeros((batch, 1)), ops.full((batch, beams - 1), _NEG)], axis=1
    )
    state = (
        prompt_length,
        running,
        running_scores,
        running,
        ops.full((batch, beams), _NEG),
        ops.broadcast_to(prompt_length, (batch, beams)),
        ops.zeros((batch, beams), dtype="bool"),
        ops.ones((batch, 1), dtype="bool"),
        ops.convert_to_tensor(False),
        cache,
    )
    state = ops.while_loop(keep_going, search_one, state)
    finished, lengths = state[3][:, 0, :], state[5][:, 0]
    return finished, lengths
