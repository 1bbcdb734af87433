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
loop stops when every row has (or at the buffer's end). Each position from
`start_index − 1` on is fed to the model exactly once, so a cache that is
not position-addressed (a recurrent state) must hold exactly the positions
before `start_index − 1`. Everything is
`keras.ops` in one `ops.while_loop`, so the whole loop compiles into a single
program (see `backend_support.compile_inference`).
"""

from keras import ops


def decode_in_place(step, state, sampler, uniforms, pad_id, process_logits=None):
    """Fills `state.token_ids` past the prompts, one position per step.

    Args:
        step: `step(token_ids (batch, 1), cache, index, *constants) ->
            (logits (batch, vocabulary), cache)`: the model on the token at
            `index`, given a cache that holds every position before it.
        state: a `DecodingState` (the right-padded prompts, where each row
            ends, the stop ids, the first position to decode, the cache
            and the step's constants).
        sampler: a `Sampler`.
        uniforms: `(batch, buffer_length)` float32 in [0, 1), the sampler's
            randomness for each position.
        pad_id: id written where a row generates nothing.
        process_logits: optionally `process_logits(logits (batch,
            vocabulary) float32, index, end_positions) -> logits`, applied
            before the sampler chooses the token after position `index`
            (e.g. suppressed tokens at −∞).

    Returns:
        `(token_ids, valid)`: the filled buffer and a bool mask `(batch,
        buffer_length)` of the positions holding a prompt or generated token.
    """
    token_ids, prompt_mask, end_positions = state.token_ids, state.prompt_mask, state.end_positions
    stop_token_ids, constants = state.stop_token_ids, state.constants
    batch, buffer_length = ops.shape(token_ids)

    def column(tensor, index):
        return ops.take(tensor, index, axis=1)

    def keep_going(index, token_ids, valid, done, cache):
        return ops.logical_and(ops.less(index, buffer_length), ops.logical_not(ops.all(done)))

    def decode_one(index, token_ids, valid, done, cache):
        previous = ops.slice(token_ids, [0, index - 1], [batch, 1])
        logits, cache = step(previous, cache, index - 1, *constants)
        if process_logits is not None:
            logits = process_logits(ops.cast(logits, "float32"), index - 1, end_positions)
        chosen = sampler.choose(logits, column(uniforms, index))
        in_prompt = column(prompt_mask, index)
        writes = ops.logical_and(
            ops.logical_not(ops.logical_or(in_prompt, done)), ops.less(index, end_positions)
        )
        token = ops.where(in_prompt, column(token_ids, index), chosen)
        token = ops.where(ops.logical_or(in_prompt, writes), token, pad_id)
        token_ids = ops.slice_update(token_ids, [0, index], ops.cast(token, "int32")[:, None])
        valid = ops.slice_update(valid, [0, index], ops.logical_or(in_prompt, writes)[:, None])
        is_stop = ops.any(ops.equal(token[:, None], stop_token_ids[None, :]), axis=-1)
        done = ops.logical_or(done, ops.logical_and(writes, is_stop))
        done = ops.logical_or(done, ops.greater_equal(index + 1, end_positions))
        return index + 1, token_ids, valid, done, cache

    start_index = ops.cast(state.start_index, "int32")
    done = ops.less_equal(end_positions, start_index)
    _, token_ids, valid, _, _ = ops.while_loop(
        keep_going, decode_one, (start_index, token_ids, prompt_mask, done, state.cache)
    )
    return token_ids, valid
