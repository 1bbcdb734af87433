"""What every task that generates token sequences shares: `generate`, its
arguments and their meaning (documented once, on `GenerativeTask.generate`),
and the template that runs it as one compiled decoding loop.

A family fills these hooks:

- `_prepare_generation(inputs, max_length, max_new_tokens, stop_ids, *,
  <the task's own options>)` → a `GenerationRequest`: checks the inputs and
  lengths and lays the prompts out in a right-padded buffer. Its
  keyword-only parameters are the task's own `generate` options.
- `_decoding_inputs(request, rows, buffer_length, prompt_length)` → a tuple
  of numpy arrays of `rows` that the compiled program takes (the prompt
  pass's tokens, an encoder's sources).
- `_start_decoding(inputs, token_ids, start_index, num_beams)` → `(cache,
  constants)`, inside the compiled program: the cache after the prompt (for
  `num_beams` rows per prompt) and what every step takes.
- `_next_token_logits(token_column, cache, index, *constants)` → `(logits,
  cache)`: one decoding step (recorded with the loop's body under torch,
  `_recorded_body`).
- optionally `_score_processor(rules)`: a function applied to each step's
  scores (suppressed tokens, a forced end token).

The step and the score processor should not branch on a tensor's value
(`backend_support.apply_when` skips work without one): under torch a body
that does cannot be recorded whole and runs eagerly around the recorded
model step.
"""

import inspect

import numpy as np
from keras import ops

from attention_zoo_keras.backend_support import compile_inference
from attention_zoo_keras.backend_support import compile_step
from attention_zoo_keras.generation.beam_search import BeamOptions
from attention_zoo_keras.generation.beam_search import beam_search
from attention_zoo_keras.generation.beam_search import beam_search_body
from attention_zoo_keras.generation.decoding_rule import decoding_rule
from attention_zoo_keras.generation.decoding_state import DecodingState
from attention_zoo_keras.generation.generate_arguments import parse_stop_token_ids
from attention_zoo_keras.generation.generate_arguments import split_generate_options
from attention_zoo_keras.generation.in_place_decoding import decode_in_place
from attention_zoo_keras.generation.in_place_decoding import sampling_body
from attention_zoo_keras.generation.samplers import sampler_uniforms
from attention_zoo_keras.models.generation_request import GenerationRequest
from attention_zoo_keras.models.generation_request import check_integer_arguments
from attention_zoo_keras.models.generation_request import right_padded
from attention_zoo_keras.models.task import Task

# Generation buffers are rounded up to this multiple so that requests of
# similar lengths reuse one compiled program.
BUFFER_MULTIPLE = 64


def round_up(value, multiple, cap):
    """`value` rounded up to a multiple of `multiple`, at most `cap` (and at
    least `value`)."""
    return max(value, min(-(-value // multiple) * multiple, cap))


class GenerativeTask(Task):
    """A `Task` with `generate` (see `GPTCausalLM`, `ReformerCausalLM`,
    `TransformerXLCausalLM`, `TransformerSeq2SeqLM`)."""

    # The longest sequence the model can generate, or `None` for no limit.
    max_generation_length = None
    # Whether prompts of different lengths are decoded apart, each group as
    # if alone (a model whose decoding depends on where its prompt ends).
    decodes_prompt_lengths_apart = False
    # Tokens at the start of each output row that are not text (the
    # decoder start token of an encoder-decoder).
    text_starts_at = 0

    def generate(
        self,
        inputs,
        max_length=None,
        max_new_tokens=None,
        sampler=None,
        num_beams=None,
        length_penalty=None,
        early_stopping=None,
        stop_token_ids="auto",
        seed=None,
        **options,
    ):
        """Continues prompts (or translates sources) token by token, in one
        compiled loop. Every generative task takes these arguments, with
        the meanings `transformers`' `generate` gives them.

        Args:
            inputs: str, list of str or dict. A string or a list of strings
                (with a preprocessor), or a dict of right-padded token ids
                and padding mask `(batch, length)`: `token_ids` and
                `padding_mask` for a decoder-only model, `encoder_token_ids`
                and `encoder_padding_mask` for an encoder-decoder.
            max_length: int or None. The total length of each output row:
                the prompt and its continuation (for an encoder-decoder, the
                decoder start token and the target, as `transformers`
                counts). Give this or `max_new_tokens`, not both; with
                neither, the task's default (the preprocessor's sequence
                length, at most the model's limit).
            max_new_tokens: int or None. The number of tokens to add to each
                prompt (to the decoder start token).
            sampler: str, `generation.Sampler` or None. How each token is
                chosen: `None` (greedy, or beam search when `num_beams > 1`),
                `"greedy"`, `"temperature"`, `"top_k"`, `"top_p"`, `"beam"`
                or a `generation.Sampler`.
            num_beams: int or None. Above 1 (with `sampler` unset or
                `"beam"`), beam search with this many beams; `sampler="beam"`
                alone searches with 4. With another sampler it is an error.
            length_penalty: float or None. Beam search scores hypotheses by
                `log p(y) / |y|^length_penalty` (`|y|` the generated
                tokens); `None`: 1.0. Beam search only.
            early_stopping: bool, `"never"` or None. Beam search's stopping
                rule, `True`, `False` or `"never"`, as in `transformers`;
                `None`: `False`. Beam search only.
            stop_token_ids: `"auto"`, list of int or None. A row stops after
                it emits one of these ids; `"auto"` is the tokenizer's end
                token, `None` never stops early.
            seed: int or None. An int makes the random samplers reproducible
                (the same draws on every backend); `None` draws fresh
                randomness. Greedy decoding and beam search draw nothing.
            **options: dict. The sampler's options (`temperature` and `k` for
                top_k, `p` for top_p) and the task's own (e.g.
                `TransformerSeq2SeqLM`'s `decoder_start_token_id`). Any
                other name is an error that names it.

        Returns:
            Strings (decoded outputs) for text input, a single string for a
            single string; otherwise a dict of numpy `token_ids` and
            `padding_mask` `(batch, length)`, right-padded, each row its
            prompt (its decoder start token) and what was generated.

        Prompts of different lengths share one buffer (see
        `generation.decode_in_place`); the cache of the prompts is filled
        once, then each step extends it by one token. The whole loop is one
        compiled program per backend (`backend_support.compile_inference`);
        buffer lengths are rounded up so that new prompts rarely need a new
        compilation.

        Example:

        >>> lm.generate(["The Transformer", "Attention is"], max_length=32)  # doctest: +SKIP
        >>> lm.generate("Once upon", max_new_tokens=20, sampler="top_p", p=0.9,
        ...             temperature=0.8, seed=0)                          # doctest: +SKIP
        >>> lm.generate("Once upon", max_new_tokens=20, num_beams=4)      # doctest: +SKIP
        """
        arguments = [p for p in inspect.signature(GenerativeTask.generate).parameters if p != "self"]
        sampler_options, task_options = split_generate_options(
            options, self._task_generate_options(), arguments[1:-1], f"{type(self).__name__}.generate()"
        )
        rule = decoding_rule(sampler, num_beams, length_penalty, early_stopping, **sampler_options)
        check_integer_arguments(max_length, max_new_tokens, seed)
        end_token_id = None if self.preprocessor is None else self.preprocessor.tokenizer.end_token_id
        stop_ids = parse_stop_token_ids(stop_token_ids, end_token_id)
        request = self._prepare_generation(inputs, max_length, max_new_tokens, stop_ids, **task_options)
        if isinstance(rule, BeamOptions):
            token_ids, valid = self._beam_generate(request, rule)
        else:
            token_ids, valid = self._sample_generate(request, rule, seed)
        return self._generation_outputs(request, token_ids, valid)

    # --- arguments ----------------------------------------------------------

    def _task_generate_options(self):
        """The task's own `generate` options: the keyword-only parameters
        of its `_prepare_generation`."""
        parameters = inspect.signature(self._prepare_generation).parameters.values()
        return [p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY]

    # --- hooks a family fills -----------------------------------------------

    def _prepare_generation(self, inputs, max_length, max_new_tokens, stop_ids):
        """A `GenerationRequest` for `inputs` (see the module docstring)."""
        raise NotImplementedError

    def _decoding_inputs(self, request, rows, buffer_length, prompt_length):
        """Numpy arrays of `rows` the compiled program takes (see the module
        docstring)."""
        raise NotImplementedError

    def _start_decoding(self, inputs, token_ids, start_index, num_beams):
        """`(cache, constants)` inside the compiled program (see the module
        docstring)."""
        raise NotImplementedError

    def _score_processor(self, rules):
        """A function `(scores, index, end_positions) -> scores` applied to
        each step's scores, or `None`."""
        return None

    # --- the template -------------------------------------------------------

    def _request(self, prompts, end_positions, stop_ids, pad_id, **fields):
        """A `GenerationRequest` of `prompts` (id lists) in a buffer that
        holds every row up to its end position (`_buffer_length`)."""
        end_positions = np.asarray(end_positions, dtype="int32")
        token_ids, prompt_mask = right_padded(prompts, self._buffer_length(end_positions), pad_id)
        lengths = np.array([len(ids) for ids in prompts])
        return GenerationRequest(token_ids, prompt_mask, lengths, end_positions, tuple(stop_ids), pad_id, **fields)

    def _buffer_length(self, end_positions):
        """The generation buffer for rows ending at `end_positions`: the
        longest, rounded up to `BUFFER_MULTIPLE` (at most the model's limit)."""
        limit = self.max_generation_length
        return round_up(int(end_positions.max()), BUFFER_MULTIPLE, float("inf") if limit is None else limit)

    def _row_groups(self, request, by_prompt_length):
        """`(rows, buffer_length)` pairs decoded together: all rows, or one
        group per prompt length (beam search, whose prompts must have one
        length; `decodes_prompt_lengths_apart`, each group in its own
        buffer)."""
        lengths = request.prompt_lengths
        buffer_length = request.token_ids.shape[1]
        if not (by_prompt_length or self.decodes_prompt_lengths_apart):
            return [(np.arange(len(lengths)), buffer_length)]
        groups = []
        for length in np.unique(lengths):
            rows = np.flatnonzero(lengths == length)
            if self.decodes_prompt_lengths_apart:
                groups.append((rows, self._buffer_length(request.end_positions[rows])))
            else:
                groups.append((rows, buffer_length))
        return groups

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

    def _sample_generate(self, request, sampler, seed):
        """`(token_ids, valid)` numpy `(batch, buffer_length)`: the request
        decoded with `sampler` (see `generation.decode_in_place`)."""

        def build():
            process = self._score_processor(request.rules)
            body = self._recorded_body(lambda step: sampling_body(step, sampler, request.pad_id, process))
            start = self._recorded_start(1)

            def run(inputs, token_ids, prompt_mask, end_positions, stop_ids, uniforms, start_index):
                cache, constants = start(inputs, token_ids, start_index)
                state = DecodingState(token_ids, prompt_mask, end_positions, stop_ids, start_index, cache, constants)
                return decode_in_place(body, state, uniforms)

            return run

        key = ("sample", type(sampler).__name__, tuple(sampler.config().items()), request.pad_id, request.rules)
        run = self._compiled(key, build)
        token_ids, valid = request.token_ids.copy(), np.zeros(request.token_ids.shape, dtype=bool)
        for rows, buffer_length in self._row_groups(request, by_prompt_length=False):
            prompt_length = int(request.prompt_lengths[rows].min())
            ends = request.end_positions[rows]
            uniforms = sampler_uniforms(sampler, len(rows), buffer_length, int(ends.max()), seed)
            ids, mask = run(
                *self._tensors(
                    self._decoding_inputs(request, rows, buffer_length, prompt_length),
                    request.token_ids[rows, :buffer_length],
                    request.prompt_mask[rows, :buffer_length],
                    ends,
                    self._stop_tensor(request),
                    uniforms,
                    np.int32(prompt_length),
                )
            )
            token_ids[rows, :buffer_length] = ops.convert_to_numpy(ids)
            valid[rows, :buffer_length] = ops.convert_to_numpy(mask)
        return token_ids, valid

    def _beam_generate(self, request, options):
        """`(token_ids, valid)` numpy `(batch, buffer_length)`: the best
        hypothesis of beam search for each prompt. Prompts of one length are
        searched together (the length penalty counts generated tokens, so a
        prompt's result never depends on the others in the batch)."""

        def build():
            process = self._score_processor(request.rules)
            body = self._recorded_body(lambda step: beam_search_body(step, options, process_log_probs=process))
            start = self._recorded_start(options.num_beams)

            def run(inputs, token_ids, end_positions, stop_ids, start_index):
                cache, constants = start(inputs, token_ids, start_index)
                state = DecodingState(token_ids, None, end_positions, stop_ids, start_index, cache, constants)
                return beam_search(body, state, options)

            return run

        run = self._compiled(("beam", options, request.rules), build)
        token_ids, valid = request.token_ids.copy(), np.zeros(request.token_ids.shape, dtype=bool)
        for rows, buffer_length in self._row_groups(request, by_prompt_length=True):
            prompt_length = int(request.prompt_lengths[rows[0]])
            best, best_lengths = run(
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
        return token_ids, valid

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

    def _generation_outputs(self, request, token_ids, valid):
        """`generate`'s result: texts for text input, else the dict of
        `token_ids` and `padding_mask`, trimmed to the longest row."""
        length = int(valid.any(axis=0).nonzero()[0].max()) + 1
        token_ids, valid = token_ids[:, :length], valid[:, :length]
        if not request.is_text:
            return {"token_ids": token_ids, "padding_mask": valid.astype("int32")}
        tokenizer = self.preprocessor.tokenizer
        texts = [tokenizer.decode(ids[mask][self.text_starts_at :]) for ids, mask in zip(token_ids, valid)]
        return texts[0] if request.is_single else texts
