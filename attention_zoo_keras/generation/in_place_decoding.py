"""Token-by-token decoding of right-padded prompts in one fixed buffer.

Prompts of different lengths share a `(batch, buffer_length)` buffer, each
right-padded (KerasHub's scheme). Decoding starts at the shortest prompt's
end; step `t` runs the model on the tokens at `t − 1`, which extends the
cache (a key/value cache, or a recurrent state) by that position, and then
writes position `t`:

    token[b, t] = prompt[b, t]                   if t is inside prompt b
                = sampler(logits[b], u[b, t])    if row b is still generating
                = pad                            otherwise

A row stops after it emits a stop token or reaches its end position; the
loop stops when every row has (or at the buffer's end); steps run past
that point write pad ids over pad ids. Each position from
`start_index − 1` on is fed to the model exactly once, so a cache that is
not position-addressed (a recurrent state) must hold exactly the positions
before `start_index − 1`. Everything is
`keras.ops` in one `ops.while_loop`, so the whole loop compiles into a single
program (see `backend_support.compile_inference`); where the cache grows with
the positions written (on a CPU, `cache_growth`), one loop per cache
size. The loop's body reads
positions through tensor indices only (`take`, `write_rows`), never Python
slices, so under torch it can be recorded once and replayed at every
position (`backend_support.compile_step`).
"""

from keras import ops

from attention_zoo_keras.backend_support import decoding_while_loop
from attention_zoo_keras.backend_support import write_rows
from attention_zoo_keras.generation.cache_growth import run_with_growing_cache
from attention_zoo_keras.generation.decoding_controls import DecodingHistory


def sampling_body(step, sampler, pad_id, process_logits=None, with_scores=False):
    """The loop's body: `body(index, token_ids, valid, scores, done, cache,
    fixed) -> (index + 1, token_ids, valid, scores, done, cache)` writes
    position `index`.

    `fixed` is `(prompt_mask, end_positions, stop_token_ids, uniforms,
    constants)` (see `decode_in_place`): every tensor the body reads is an
    argument, so a recording of it serves every call.

    Args:
        step: callable. `step(token_ids (batch, 1), cache, index,
            *constants) -> (logits (batch, vocabulary), cache)`: the model on
            the token at `index`, given a cache that holds every position
            before it.
        sampler: Sampler. The per-step decoding rule.
        pad_id: int. The id written where a row generates nothing.
        process_logits: callable or None. Optionally
            `process_logits(logits (batch, vocabulary) float32, history) ->
            logits`, applied before the sampler chooses the token after
            position `history.last_index` (`history` a
            `decoding_controls.DecodingHistory`: the decoding controls,
            suppressed tokens at −∞).
        with_scores: bool. Whether to write each generated token's
            log-probability (`Sampler.scored_choice`) into `scores`
            (otherwise `scores` is passed through untouched).
    """

    def decode_one(index, token_ids, valid, scores, done, cache, fixed):
        prompt_mask, end_positions, stop_token_ids, uniforms, constants = fixed
        previous = ops.take(token_ids, ops.reshape(index - 1, (1,)), axis=1)
        logits, cache = step(previous, cache, index - 1, *constants)
        if process_logits is not None:
            prompt_lengths = ops.sum(ops.cast(prompt_mask, "int32"), axis=1)
            history = DecodingHistory(token_ids, index - 1, prompt_lengths, end_positions, stop_token_ids)
            logits = process_logits(ops.cast(logits, "float32"), history)
        uniform = ops.take(uniforms, index, axis=1)
        if with_scores:
            chosen, log_probs = sampler.scored_choice(logits, uniform)
        else:
            chosen = sampler.choose(logits, uniform)
        in_prompt = ops.take(prompt_mask, index, axis=1)
        writes = ops.logical_and(
            ops.logical_not(ops.logical_or(in_prompt, done)), ops.less(index, end_positions)
        )
        token = ops.where(in_prompt, ops.take(token_ids, index, axis=1), chosen)
        token = ops.where(ops.logical_or(in_prompt, writes), token, pad_id)
        token_ids = write_rows(token_ids, index, ops.cast(token, "int32")[:, None])
        valid = write_rows(valid, index, ops.logical_or(in_prompt, writes)[:, None])
        if with_scores:
            scores = write_rows(scores, index, ops.where(writes, ops.cast(log_probs, "float32"), 0.0)[:, None])
        is_stop = ops.any(ops.equal(token[:, None], stop_token_ids[None, :]), axis=-1)
        done = ops.logical_or(done, ops.logical_and(writes, is_stop))
        done = ops.logical_or(done, ops.greater_equal(index + 1, end_positions))
        return index + 1, token_ids, valid, scores, done, cache

    return decode_one


def fixed_inputs(state, uniforms):
    """`fixed`, what every step of the loop reads besides its own state:
    `(prompt_mask, end_positions, stop_token_ids, uniforms, constants)`.

    Args:
        state: DecodingState. The decoding's start.
        uniforms: float32 tensor of shape `(batch, buffer_length)`. The
            sampler's randomness for each position.
    """
    return (state.prompt_mask, state.end_positions, state.stop_token_ids, uniforms, tuple(state.constants))


def start_loop(state):
    """The loop's state before its first step: `(index, token_ids, valid,
    scores, done, cache)`, `index` the first position to write, `valid` the
    prompt mask, `scores` zeros (float32, the buffer's shape), `done` the
    rows that write nothing.

    Args:
        state: DecodingState. The decoding's start.
    """
    start_index = ops.cast(state.start_index, "int32")
    done = ops.less_equal(state.end_positions, start_index)
    scores = ops.zeros(ops.shape(state.token_ids), "float32")
    return start_index, state.token_ids, ops.copy(state.prompt_mask), scores, done, state.cache


def decode_until(body, loop_state, fixed, until):
    """Runs the loop from `loop_state` (`start_loop`'s, or an earlier
    call's) up to position `until`, or until every row is done.

    A stream of tokens is this call repeated with growing `until` (one
    compiled program for every chunk, `until` being a tensor); one call with
    `until` at the buffer's end is the whole decoding.

    Args:
        body: callable. A `sampling_body` (or a recording of one).
        loop_state: tuple. `(index, token_ids, valid, scores, done, cache)`.
        fixed: tuple. `fixed_inputs`' result.
        until: int32 scalar. The position to stop before (capped at the
            buffer's end).

    Returns:
        The loop's state after the last step run.
    """
    index, token_ids = loop_state[0], loop_state[1]
    limit = ops.minimum(ops.cast(until, "int32"), ops.shape(token_ids)[1])

    def keep_going(index, token_ids, valid, scores, done, cache):
        return ops.logical_and(ops.less(index, limit), ops.logical_not(ops.all(done)))

    # Once every row is done a step writes pad ids over pad ids: running
    # past the end changes nothing (see `decoding_while_loop`).
    return decoding_while_loop(
        keep_going, lambda *loop_state: body(*loop_state, fixed), tuple(loop_state), max_steps=limit - index
    )


def decode_in_place(body, state, uniforms, cache_growth=None):
    """Fills `state.token_ids` past the prompts, one position per step.

    Args:
        body: callable. A `sampling_body` (or a recording of one).
        state: DecodingState. The right-padded prompts, where each row
            ends, the stop ids, the first position to decode, the cache
            and the step's constants. Its `token_ids` are written in place
            under torch (see `write_rows`).
        uniforms: float32 tensor of shape `(batch, buffer_length)`. Numbers
            in [0, 1), the sampler's randomness for each position.
        cache_growth: CacheGrowth or None. How the cache grows with the
            positions written (`cache_growth.run_with_growing_cache`), or
            `None` for a cache that keeps the buffer's size.

    Returns:
        `(token_ids, valid, scores)`: the filled buffer, a bool mask
        `(batch, buffer_length)` of the positions holding a prompt or
        generated token, and the generated tokens' log-probabilities (zeros
        unless the body writes them).
    """
    fixed = fixed_inputs(state, uniforms)
    _, token_ids, valid, scores, _, _ = run_with_growing_cache(
        lambda loop_state, until: decode_until(body, loop_state, fixed, until),
        start_loop(state),
        state.token_ids,
        state.start_index_bound,
        cache_growth,
        reads_per_step=1,
    )
    return token_ids, valid, scores
