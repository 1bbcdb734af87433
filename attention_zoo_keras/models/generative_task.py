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
  scores (suppressed tokens, a forced end token);
- optionally `_cache_growth()`: a `CacheGrowth`, for a cache that grows
  with the positions written (`generation.cache_growth`), with
  `_start_index_bound(inputs, token_ids)`, the sizes' lower bound.

The step and the score processor should not branch on a tensor's value
(`backend_support.apply_when` skips work without one): under torch a body
that does cannot be recorded whole and runs eagerly around the recorded
model step.
"""

import dataclasses
import inspect

import numpy as np

from attention_zoo_keras.generation.beam_search import BeamOptions
from attention_zoo_keras.generation.decoding_controls import decoding_controls
from attention_zoo_keras.generation.decoding_rule import decoding_rule
from attention_zoo_keras.generation.generate_arguments import parse_stop_token_ids
from attention_zoo_keras.generation.generate_arguments import split_generate_options
from attention_zoo_keras.generation.streaming import check_streamer
from attention_zoo_keras.generation.streaming import feed_streamer
from attention_zoo_keras.generation.streaming import text_pieces
from attention_zoo_keras.models.decoding_programs import DecodingPrograms
from attention_zoo_keras.models.generation_request import DecodedRows
from attention_zoo_keras.models.generation_request import GenerationRequest
from attention_zoo_keras.models.generation_request import check_integer_arguments
from attention_zoo_keras.models.generation_request import right_padded
from attention_zoo_keras.models.input_validation import check_id_range
from attention_zoo_keras.models.task import Task

# Generation buffers are rounded up to this multiple so that requests of
# similar lengths reuse one compiled program.
BUFFER_MULTIPLE = 64


def round_up(value, multiple, cap):
    """`value` rounded up to a multiple of `multiple`, at most `cap` (and at
    least `value`)."""
    return max(value, min(-(-value // multiple) * multiple, cap))


class GenerativeTask(DecodingPrograms, Task):
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
        min_new_tokens=None,
        repetition_penalty=None,
        no_repeat_ngram_size=None,
        bad_words_ids=None,
        seed=None,
        return_scores=False,
        streamer=None,
        stream=False,
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
            max_new_tokens: int, list of int or None. The number of tokens
                to add to each prompt (to the decoder start token), or one
                such number per prompt.
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
            min_new_tokens: int or None. The stop ids cannot be chosen
                before a row has generated this many tokens.
            repetition_penalty: float or None. Scores of the ids already in
                a row (prompt included) are divided by it where positive and
                multiplied where negative (CTRL, Keskar et al. 2019): above
                1 discourages repeats. Beam search applies it to
                log-probabilities, as `transformers` does.
            no_repeat_ngram_size: int or None. No n-gram of this size
                occurs twice in a row (prompt included).
            bad_words_ids: list of lists of int, or None. Id sequences
                never generated: a one-id entry is never chosen, a longer
                one's last id not after its other ids. (As in
                `transformers`, a one-id entry that is a stop id is ignored:
                use `min_new_tokens` or `stop_token_ids` for those.) These
                four are `generation.decoding_controls`, in the order and
                with the meaning of `transformers`' processors of the same
                names, compiled into the loop.
            seed: int or None. An int makes the random samplers reproducible
                (the same draws on every backend); `None` draws fresh
                randomness. Greedy decoding and beam search draw nothing.
            return_scores: bool. Also return each generated token's
                log-probability: the result is then a dict with
                `token_ids`, `padding_mask`, `scores` (float32 `(batch,
                length)`, 0 on prompts and padding) and, for text input,
                `text` (what `generate` returns without scores); beam search
                adds `sequence_scores` `(batch,)`, the best hypothesis'
                length-penalised score. A sampler's scores are under the
                distribution it drew from (after the controls, temperature
                and truncation), beam search's the processed
                log-probabilities: `transformers`' `compute_transition_scores`
                (with `normalize_logits=True` for the samplers).
            streamer: object or None. Gets the tokens as they are decoded,
                with `transformers`' streamer protocol: `put(ids)` with the
                prompt's ids, then each chunk's new ids (int arrays of
                shape `(1, n)`), then `end()`. One prompt only.
            stream: bool. Return an iterator of text pieces instead, each
                handed out as soon as decoded (a list of pieces, one per
                prompt, for a list of prompts); joined they are the text
                `generate` returns. Closing the iterator (or Ctrl-C) stops
                the decoding. Text input only.
            **options: dict. The sampler's options (`temperature` and `k` for
                top_k, `p` for top_p) and the task's own (e.g.
                `TransformerSeq2SeqLM`'s `decoder_start_token_id`). Any
                other name is an error that names it.

        Returns:
            Strings (decoded outputs) for text input, a single string for a
            single string; otherwise a dict of numpy `token_ids` and
            `padding_mask` `(batch, length)`, right-padded, each row its
            prompt (its decoder start token) and what was generated. With
            `return_scores`, a dict (see above). With `stream=True`, an
            iterator of text pieces.

        Prompts of different lengths share one buffer (see
        `generation.decode_in_place`); the cache of the prompts is filled
        once, then each step extends it by one token. The whole loop is one
        compiled program per backend (`backend_support.compile_inference`);
        buffer lengths are rounded up so that new prompts rarely need a new
        compilation. Streamed, the loop runs in chunks of up to 16 tokens
        (`generation.streaming`); beam search, whose best hypothesis is
        known only at the end, hands out its result at the end.

        Example:

        >>> lm.generate(["The Transformer", "Attention is"], max_length=32)  # doctest: +SKIP
        >>> lm.generate("Once upon", max_new_tokens=20, sampler="top_p", p=0.9,
        ...             temperature=0.8, seed=0)                          # doctest: +SKIP
        >>> lm.generate("Once upon", max_new_tokens=20, num_beams=4)      # doctest: +SKIP
        >>> lm.generate("Once upon", max_new_tokens=20, repetition_penalty=1.2,
        ...             no_repeat_ngram_size=3, return_scores=True)       # doctest: +SKIP
        >>> for piece in lm.generate("Once upon", max_new_tokens=20, stream=True):  # doctest: +SKIP
        ...     print(piece, end="", flush=True)
        """
        arguments = [p for p in inspect.signature(GenerativeTask.generate).parameters if p != "self"]
        sampler_options, task_options = split_generate_options(
            options, self._task_generate_options(), arguments[1:-1], f"{type(self).__name__}.generate()"
        )
        rule = decoding_rule(sampler, num_beams, length_penalty, early_stopping, **sampler_options)
        check_integer_arguments(max_length, max_new_tokens, seed)
        end_token_id = None if self.preprocessor is None else self.preprocessor.tokenizer.end_token_id
        stop_ids = parse_stop_token_ids(stop_token_ids, end_token_id)
        controls = decoding_controls(stop_ids, min_new_tokens, repetition_penalty, no_repeat_ngram_size, bad_words_ids)
        check_id_range("bad_words_ids", [i for word in controls.bad_words_ids for i in word],
                       self._output_vocabulary_size())
        if not isinstance(return_scores, bool):
            raise TypeError(f"return_scores must be True or False; got {return_scores!r}.")
        request = self._prepare_generation(inputs, max_length, max_new_tokens, stop_ids, **task_options)
        request = dataclasses.replace(request, controls=controls)
        if stream or streamer is not None:
            if return_scores:
                raise ValueError(
                    "return_scores cannot be combined with stream=True or a streamer: call generate without "
                    "streaming for the scores."
                )
            return self._streamed(request, rule, seed, streamer, stream)
        if isinstance(rule, BeamOptions):
            decoded = self._beam_generate(request, rule)
        else:
            decoded = self._sample_generate(request, rule, seed, return_scores)
        return self._generation_outputs(request, decoded, return_scores)

    def _streamed(self, request, rule, seed, streamer, stream):
        """`generate` with a `streamer` (then its usual result) or as an
        iterator of text pieces (`stream`)."""
        if streamer is not None:
            check_streamer(streamer)
            if stream:
                raise ValueError("Give streamer or stream=True, not both.")
            if len(request.token_ids) != 1:
                raise ValueError(f"A streamer takes one prompt's tokens; got {len(request.token_ids)} prompts.")
        elif not request.is_text:
            raise ValueError("stream=True streams text: give text inputs (with a preprocessor), or use a streamer.")
        if isinstance(rule, BeamOptions):
            buffers = self._beam_stream(request, rule)
        else:
            buffers = self._sample_stream(request, rule, seed)
        if stream:
            decode = self.preprocessor.tokenizer.decode
            return text_pieces(buffers, lambda ids: decode(ids[self.text_starts_at:]), request.is_single)
        return self._generation_outputs(request, DecodedRows(*feed_streamer(streamer, buffers)))

    def _beam_stream(self, request, options):
        """The prompts, then beam search's result: its best hypothesis is
        known only at the end."""
        yield request.token_ids, request.prompt_mask
        yield self._beam_generate(request, options)[:2]

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
        """A function `(scores, history) -> scores` applied to each step's
        scores after the decoding controls (`history` a
        `generation.decoding_controls.DecodingHistory`), or `None`."""
        return None

    def _output_vocabulary_size(self):
        """The number of ids the model scores at each step."""
        return self.backbone.vocabulary_size

    def _cache_growth(self):
        """How the decoding cache grows with the positions written (a
        `generation.cache_growth.CacheGrowth`, e.g. `layer_cache_growth`'s),
        or `None` for a cache that keeps the buffer's size (the default)."""
        return None

    def _start_index_bound(self, inputs, token_ids):
        """A Python int at least the first position the loop decodes and
        past every position `_start_decoding`'s cache holds, from the
        static shapes of the program's `inputs` and `token_ids` (see
        `generation.DecodingState.start_index_bound`): the buffer's length
        by default, so a cache keeps its one size."""
        return int(token_ids.shape[1])

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

    def _generation_outputs(self, request, decoded, return_scores=False):
        """`generate`'s result from `decoded` (a `DecodedRows`): texts for
        text input, else the dict of `token_ids` and `padding_mask`, trimmed
        to the longest row; with `return_scores`, the dict with the scores
        (and the texts)."""
        length = int(decoded.valid.any(axis=0).nonzero()[0].max()) + 1
        token_ids, valid = decoded.token_ids[:, :length], decoded.valid[:, :length]
        outputs = {"token_ids": token_ids, "padding_mask": valid.astype("int32")}
        if return_scores:
            outputs["scores"] = np.where(valid, decoded.scores[:, :length], 0.0).astype("float32")
            if decoded.sequence_scores is not None:
                outputs["sequence_scores"] = decoded.sequence_scores.astype("float32")
        if not request.is_text:
            return outputs
        tokenizer = self.preprocessor.tokenizer
        texts = [tokenizer.decode(ids[mask][self.text_starts_at :]) for ids, mask in zip(token_ids, valid)]
        texts = texts[0] if request.is_single else texts
        return {"text": texts, **outputs} if return_scores else texts
