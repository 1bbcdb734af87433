"""The compiled programs behind `GenerativeTask.generate`: the recorded
loop body and prompt pass, sampling (whole, or in chunks for streaming) and
beam search, each built once per setting and kept until `compile()`.

A family's hooks (`_start_decoding`, `_next_token_logits`,
`_decoding_inputs`, `_score_processor`; see `generative_task`) are what
these programs run.
"""

import numpy as np
from keras import ops

from attention_zoo_keras.backend_support import compile_inference
from attention_zoo_keras.backend_support import compile_step
from attention_zoo_keras.backend_support import compiles_loop_bodies_apart
from attention_zoo_keras.generation.beam_search import beam_search
from attention_zoo_keras.generation.beam_search import beam_search_body
from attention_zoo_keras.generation.cache_growth import cache_sizes
from attention_zoo_keras.generation.cache_growth import grown_for
from attention_zoo_keras.generation.decoding_controls import apply_controls
from attention_zoo_keras.generation.decoding_state import DecodingState
from attention_zoo_keras.generation.in_place_decoding import decode_in_place
from attention_zoo_keras.generation.in_place_decoding import decode_until
from attention_zoo_keras.generation.in_place_decoding import sampling_body
from attention_zoo_keras.generation.in_place_decoding import start_loop
from attention_zoo_keras.generation.samplers import sampler_uniforms
from attention_zoo_keras.generation.streaming import chunk_ends
from attention_zoo_keras.models.generation_request import DecodedRows


class DecodingPrograms:
    """Mixin for `GenerativeTask`: the decoding programs, compiled per
    backend (`backend_support.compile_inference`)."""

    def _decoding_step(self, recorded=True):
        """The function the decoding loop calls at every position,
        `step(token_column, cache, index, *constants) -> (logits, cache)`:
        `_next_token_logits`, made cheap per call (`compile_step`) if
        `recorded`."""
        if not recorded:
            return self._next_token_logits
        return compile_step(self._next_token_logits, self.variables)

    def _recorded_body(self, make_body):
        """The decoding loop's body, `make_body(step)`, made cheap per call.

        Under torch the whole body (the model's step, the sampler, the
        buffer writes) is recorded once per input signature, compiled by
        inductor after `compile(jit_compile=True)`, and on CUDA replayed as
        one captured CUDA graph (`compile_step`), so a token costs one
        launch rather than hundreds of Python-dispatched operations. A
        body that branches on a tensor's value (the Reformer's first step,
        a forced end token) cannot be recorded whole: it runs eagerly
        around the recorded model step instead. Under JAX and TensorFlow
        the loop is compiled whole anyway and this is `make_body(step)`.
        """
        return compile_step(
            make_body(self._decoding_step(recorded=False)),
            self.variables,
            on_new_signature=self._announcer("the decoding step"),
            compile_program=self.jit_compile is True,
            fallback=make_body(self._decoding_step()),
            capture_cuda_graph=True,
        )

    def _recorded_start(self, num_beams):
        """`_start_decoding` for `num_beams` rows per prompt, `start(inputs,
        token_ids, start_index) -> (cache, constants)`: the prompt pass (or
        the encoder) recorded once per input signature under torch, like
        the loop's body (`_recorded_body`); a family whose pass branches on
        a value runs it eagerly. Shared by every sampler's loop."""

        def start(inputs, token_ids, start_index):
            return self._start_decoding(inputs, token_ids, start_index, num_beams)

        return self._generation_function(
            ("start", num_beams),
            lambda: compile_step(
                start,
                self.variables,
                on_new_signature=self._announcer("the prompt pass"),
                compile_program=self.jit_compile is True,
                fallback=start,
            ),
        )

    def _loop_cache_growth(self):
        """How the loops grow the cache: the family's `_cache_growth()`, or
        `None` where `compile(jit_compile=True)` compiles the loop's body
        alone (torch: each cache size would be one more inductor
        compilation, seconds to minutes each, and one compilation per
        shape is what is asked). Under JAX (whose `jit_compile` is always
        true) and TensorFlow every decoding loop is compiled whole, the
        sizes one loop each in the one program."""
        if self.jit_compile is True and compiles_loop_bodies_apart():
            return None
        return self._cache_growth()

    def _forget_compiled_functions(self):
        super()._forget_compiled_functions()
        self.__dict__.pop("_generation_functions", None)

    def compile(self, *args, **kwargs):
        """`Task.compile`; the generation functions are made anew after it
        (under torch they follow `jit_compile`)."""
        self.__dict__.pop("_generation_functions", None)
        super().compile(*args, **kwargs)

    def _generation_function(self, key, build):
        """The generation function for `key`, built once by `build()` (and
        forgotten with the compiled functions, or by `compile()`)."""
        functions = self.__dict__.setdefault("_generation_functions", {})
        if key not in functions:
            functions[key] = build()
        return functions[key]

    def _compiled(self, key, build):
        """The compiled generation function for `key`, built once by `build()`."""
        return self._generation_function(key, lambda: compile_inference(build(), self.variables))

    def _score_rules(self, request):
        """What each step applies to its scores: the request's decoding
        controls, then the task's own rules (`_score_processor`); `None`
        for neither."""
        task_rules = self._score_processor(request.rules)
        controls = request.controls
        if not controls.active:
            return task_rules
        if task_rules is None:
            return lambda scores, history: apply_controls(controls, scores, history)
        return lambda scores, history: task_rules(apply_controls(controls, scores, history), history)

    def _sampling_body(self, request, sampler, with_scores=False):
        """The loop's body for `sampler` (recorded under torch)."""
        process = self._score_rules(request)
        return self._recorded_body(lambda step: sampling_body(step, sampler, request.pad_id, process, with_scores))

    @staticmethod
    def _sampling_key(request, sampler):
        return (type(sampler).__name__, tuple(sampler.config().items()), request.pad_id, request.rules,
                request.controls)

    def _sampling_groups(self, request, sampler, seed):
        """For each group of rows decoded together (`_row_groups`): `(rows,
        buffer_length, prompt_length, program inputs)`, the inputs being
        `(decoding inputs, token_ids, prompt_mask, end_positions, stop_ids,
        uniforms, start_index)` as tensors."""
        for rows, buffer_length in self._row_groups(request, by_prompt_length=False):
            prompt_length = int(request.prompt_lengths[rows].min())
            ends = request.end_positions[rows]
            inputs = self._tensors(
                self._decoding_inputs(request, rows, buffer_length, prompt_length),
                request.token_ids[rows, :buffer_length],
                request.prompt_mask[rows, :buffer_length],
                ends,
                self._stop_tensor(request),
                sampler_uniforms(sampler, len(rows), buffer_length, int(ends.max()), seed),
                np.int32(prompt_length),
            )
            yield rows, buffer_length, prompt_length, inputs

    def _sample_generate(self, request, sampler, seed, with_scores=False):
        """`DecodedRows` of the request decoded with `sampler` in one
        program (see `generation.decode_in_place`), with the tokens'
        log-probabilities if `with_scores`."""

        def build():
            body, start = self._sampling_body(request, sampler, with_scores), self._recorded_start(1)

            def run(inputs, token_ids, prompt_mask, end_positions, stop_ids, uniforms, start_index):
                cache, constants = start(inputs, token_ids, start_index)
                state = DecodingState(
                    token_ids, prompt_mask, end_positions, stop_ids, start_index,
                    self._start_index_bound(inputs, token_ids), cache, constants,
                )
                return decode_in_place(body, state, uniforms, self._loop_cache_growth())

            return run

        run = self._compiled(("sample", *self._sampling_key(request, sampler), with_scores), build)
        token_ids, valid = request.token_ids.copy(), np.zeros(request.token_ids.shape, dtype=bool)
        scores = np.zeros(request.token_ids.shape, dtype="float32")
        for rows, buffer_length, _, inputs in self._sampling_groups(request, sampler, seed):
            ids, mask, row_scores = run(*inputs)
            token_ids[rows, :buffer_length] = ops.convert_to_numpy(ids)
            valid[rows, :buffer_length] = ops.convert_to_numpy(mask)
            scores[rows, :buffer_length] = ops.convert_to_numpy(row_scores)
        return DecodedRows(token_ids, valid, scores)

    def _sample_stream(self, request, sampler, seed):
        """Yields `(token_ids, valid)` numpy `(batch, buffer_length)` of the
        whole batch: the prompts, then the buffer after each chunk of the
        loop (`generation.streaming.chunk_ends`), the last one
        `_sample_generate`'s result. Two programs: the prompt pass, and a
        chunk of steps (`decode_until`) called with a growing end."""

        def build_start():
            start = self._recorded_start(1)

            def run_start(inputs, token_ids, prompt_mask, end_positions, start_index):
                cache, constants = start(inputs, token_ids, start_index)
                state = DecodingState(
                    token_ids, prompt_mask, end_positions, None, start_index,
                    self._start_index_bound(inputs, token_ids), cache, constants,
                )
                return start_loop(state), tuple(constants)

            return run_start

        def build_chunk():
            body = self._sampling_body(request, sampler)
            return lambda loop_state, fixed, until: decode_until(body, loop_state, fixed, until)

        key = self._sampling_key(request, sampler)
        run_start = self._compiled(("stream start", *key), build_start)
        run_chunk = self._compiled(("stream chunk", *key), build_chunk)
        growth = self._loop_cache_growth()
        token_ids, valid = request.token_ids.copy(), request.prompt_mask.copy()
        yield token_ids, valid
        for rows, buffer_length, prompt_length, inputs in self._sampling_groups(request, sampler, seed):
            decoding_inputs, ids, prompt_mask, ends, stop_ids, uniforms, start_index = inputs
            loop_state, constants = run_start(decoding_inputs, ids, prompt_mask, ends, start_index)
            fixed = (prompt_mask, ends, stop_ids, uniforms, constants)
            sizes = cache_sizes(ids, prompt_length, loop_state[-1], 1, growth)
            for until in chunk_ends(prompt_length, buffer_length):
                loop_state = grown_for(loop_state, until, sizes, growth)
                loop_state = run_chunk(loop_state, fixed, ops.convert_to_tensor(np.int32(until)))
                token_ids[rows, :buffer_length] = ops.convert_to_numpy(loop_state[1])
                valid[rows, :buffer_length] = ops.convert_to_numpy(loop_state[2])
                yield token_ids, valid
                if ops.convert_to_numpy(loop_state[4]).all():
                    break

    def _beam_generate(self, request, options):
        """`DecodedRows` of the best hypothesis of beam search for each
        prompt, with its tokens' log-probabilities and its score. Prompts
        of one length are searched together (the length penalty counts
        generated tokens, so a prompt's result never depends on the others
        in the batch)."""

        def build():
            process = self._score_rules(request)
            body = self._recorded_body(lambda step: beam_search_body(step, options, process_log_probs=process))
            start = self._recorded_start(options.num_beams)

            def run(inputs, token_ids, end_positions, stop_ids, start_index):
                cache, constants = start(inputs, token_ids, start_index)
                state = DecodingState(
                    token_ids, None, end_positions, stop_ids, start_index, self._start_index_bound(inputs, token_ids),
                    cache, constants,
                )
                return beam_search(body, state, options, self._loop_cache_growth())

            return run

        run = self._compiled(("beam", options, request.rules, request.controls), build)
        token_ids, valid = request.token_ids.copy(), np.zeros(request.token_ids.shape, dtype=bool)
        scores = np.zeros(request.token_ids.shape, dtype="float32")
        sequence_scores = np.zeros(len(token_ids), dtype="float32")
        for rows, buffer_length in self._row_groups(request, by_prompt_length=True):
            prompt_length = int(request.prompt_lengths[rows[0]])
            best, best_lengths, best_scores, best_sequence_scores = run(
                *self._tensors(
                    self._decoding_inputs(request, rows, buffer_length, prompt_length),
                    request.token_ids[rows, :buffer_length],
                    request.end_positions[rows],
                    self._stop_tensor(request),
                    np.int32(prompt_length),
                )
            )
            token_ids[rows, :buffer_length] = ops.convert_to_numpy(best)
            best_lengths = np.asarray(ops.convert_to_numpy(best_lengths))
            valid[rows, :buffer_length] = np.arange(buffer_length)[None, :] < best_lengths[:, None]
            scores[rows, :buffer_length] = ops.convert_to_numpy(best_scores)
            sequence_scores[rows] = ops.convert_to_numpy(best_sequence_scores)
        return DecodedRows(token_ids, valid, scores, sequence_scores)

    @staticmethod
    def _stop_tensor(request):
        return np.array(request.stop_ids or [-1], dtype="int32")

    @staticmethod
    def _tensors(*arrays):
        """The compiled program's arguments: each array (or tuple of
        arrays) as tensors."""
        return [
            tuple(ops.convert_to_tensor(a) for a in array) if isinstance(array, tuple) else ops.convert_to_tensor(array)
            for array in arrays
        ]
