"""What decoder-only language models share: generation from prompts with a
decoding cache, in one compiled loop (sampling, or beam search).

A subclass builds its graph, and says how its layers run over new tokens
with a cache:

- `_decoder_pass(token_ids, cache, cache_update_index, padding_mask=None,
  constants=())` → `(hidden, cache)`: the blocks over new tokens;
- `_next_token_logits(token_column, cache, index, *constants)` →
  `(logits (batch, vocabulary), cache)`: one decoding step;
- `_decoding_constants(buffer_length)`: tensors every step takes, computed
  once per generation (e.g. a transposed output matrix);
- `max_generation_length`: the longest sequence it can generate, or `None`.

A model whose cache cannot reproduce its full pass (the Reformer's LSH
attention) also overrides `_prefilled_cache` and `_decoding_step`, so that
the prompt pass's own logits start the loop.
"""

import keras
import numpy as np
from keras import ops

from attention_zoo_keras.attention.registry import get_decoding
from attention_zoo_keras.backend_support import compile_step
from attention_zoo_keras.generation.beam_search import beam_search
from attention_zoo_keras.generation.beam_search import check_beam_options
from attention_zoo_keras.generation.in_place_decoding import decode_in_place
from attention_zoo_keras.generation.samplers import get_sampler
from attention_zoo_keras.generation.samplers import sampler_uniforms
from attention_zoo_keras.models.generative_task import BUFFER_MULTIPLE
from attention_zoo_keras.models.generative_task import GenerativeTask
from attention_zoo_keras.models.generative_task import check_beam_sampler_options
from attention_zoo_keras.models.generative_task import right_padded
from attention_zoo_keras.models.generative_task import round_up
from attention_zoo_keras.models.input_validation import check_id_range
from attention_zoo_keras.models.text_preprocessor import as_text_list

# Prompt passes are rounded up to this multiple so that prompts of similar
# lengths reuse one compiled program.
PROMPT_MULTIPLE = 16


class CausalLM(GenerativeTask):
    """A decoder-only language model that generates (see `GPTCausalLM`,
    `TransformerXLCausalLM`)."""

    max_generation_length = None

    def _decoding_constants(self, buffer_length):
        """Tensors every decoding step takes, computed once per generation."""
        return ()

    def _new_token_embeddings(self, token_ids, cache_update_index, padding_mask=None):
        """`(x, attention_mask)` for a decoder pass over new tokens: the
        backbone's token plus position embeddings at `cache_update_index …`
        (a backbone with `token_embedding` and a `position_embedding` taking
        `start_index`), and the key-padding mask `(batch, 1, positions)` of
        `padding_mask`, or `None`."""
        backbone = self.backbone
        x = backbone.token_embedding(token_ids)
        x = x + backbone.position_embedding(token_ids, start_index=cache_update_index)
        attention_mask = None
        if padding_mask is not None:
            attention_mask = ops.expand_dims(ops.cast(padding_mask, "bool"), axis=1)
        return x, attention_mask

    def _decoding_step(self):
        """The function the decoding loop calls at every position,
        `step(token_column, cache, index, *constants) -> (logits, cache)`:
        `_next_token_logits`, made cheap per call (`compile_step`)."""
        return compile_step(self._next_token_logits, self.variables)

    @property
    def decoding(self):
        """The attention mechanism's `DecodingCache` (see
        `attention.registry`): what each layer's cache is."""
        return get_decoding(self.backbone.transformer_layers[0].self_attention.attention)

    def init_cache(self, batch_size, max_length):
        """An empty decoding cache: per decoder layer, the mechanism's
        `initial_cache`. For softmax a `(key_cache, value_cache)` pair, each
        `(batch, max_length, num_heads, head_dim)` in the backbone's compute
        dtype; for linear the recurrent state `(S, z)`, `(batch, num_heads,
        head_dim, head_dim)` and `(batch, num_heads, head_dim)` in float32,
        the same size for any `max_length`.

        Use the cache `call_with_cache` returns, not the one passed in: under
        torch without gradients a key/value cache is written in place (see
        `backend_support.write_rows`).
        """
        return tuple(
            block.self_attention.initial_cache(batch_size, max_length) for block in self.backbone.transformer_layers
        )

    def _prompts(self, inputs):
        """`(list of id lists, is_text, is_single)` from raw text or a dict."""
        preprocessor = self.preprocessor
        if isinstance(inputs, dict):
            token_ids = np.asarray(ops.convert_to_numpy(inputs["token_ids"]))
            if "padding_mask" in inputs:
                mask = np.asarray(ops.convert_to_numpy(inputs["padding_mask"])).astype(bool)
            else:
                mask = np.ones(token_ids.shape, dtype=bool)
            if token_ids.ndim == 1:
                token_ids, mask = token_ids[None], mask[None]
            prompts = []
            for row, (ids, valid) in enumerate(zip(token_ids, mask)):
                length = int(valid.sum())
                if not valid[:length].all():
                    raise ValueError(
                        f"Prompt {row}'s padding_mask is not right-padded (real tokens first, "
                        "then padding); generate takes right-padded prompts."
                    )
                prompts.append([int(i) for i in ids[:length]])
            return prompts, False, False
        if preprocessor is None or not preprocessor.is_raw(inputs):
            raise TypeError(
                "generate takes raw strings (with a preprocessor) or a dict of token_ids and "
                f"padding_mask; got {type(inputs).__name__}."
            )
        prompts = preprocessor.tokenizer.encode(as_text_list(inputs))
        return prompts, True, isinstance(inputs, str)

    def generate(
        self,
        inputs,
        max_length=None,
        max_new_tokens=None,
        stop_token_ids="auto",
        sampler="greedy",
        seed=None,
        **sampler_options,
    ):
        """Continues prompts with a decoding cache, in one compiled loop.

        The cache is the attention mechanism's (`decoding`): a key/value
        cache for softmax; for linear attention the recurrent state, so
        memory per sequence is constant in the generated length.

        Args:
            inputs: a string or a list of strings (tokenized without an end
                token), or a dict of `token_ids` and `padding_mask`
                `(batch, length)` of right-padded prompts.
            max_length: total length (prompt and continuation) of every
                row. Give this or `max_new_tokens`, not both; with neither,
                the preprocessor's `sequence_length` (or the backbone's
                `max_sequence_length`, if it has one).
            max_new_tokens: number of tokens to add to each prompt.
            stop_token_ids: a row stops after it emits one of these ids;
                `"auto"` is the tokenizer's end token, `None` never stops early.
            sampler: `"greedy"`, `"temperature"`, `"top_k"`, `"top_p"`,
                `"beam"`, or a `generation.Sampler`.
            seed: an int makes the random samplers reproducible (the same
                draws on every backend); `None` draws fresh randomness.
            **sampler_options: the sampler's options: `temperature` and `k`
                (top_k), `p` (top_p), `num_beams`, `length_penalty` and
                `early_stopping` (beam).

        Returns:
            Strings (prompt and continuation, decoded) for text input, a
            single string for a single string; otherwise a dict of numpy
            `token_ids` and `padding_mask` `(batch, length)`, right-padded.

        Prompts of different lengths share one buffer (see
        `generation.decode_in_place`); one pass over the prompts fills the
        cache, then each step extends it by one token. The whole loop is one
        compiled program per backend (`backend_support.compile_inference`);
        buffer lengths are rounded up so that new prompts rarely need a new
        compilation, and so are prompt-pass lengths for a position-addressed
        cache (see `_prompt_pass_length`).

        Example:

        >>> lm.generate(["The Transformer", "Attention is"], max_length=32)  # doctest: +SKIP
        >>> lm.generate("Once upon", max_new_tokens=20, sampler="top_p", p=0.9,
        ...             temperature=0.8, seed=0)                          # doctest: +SKIP
        >>> lm.generate("Once upon", max_new_tokens=20, sampler="beam", num_beams=4)  # doctest: +SKIP
        """
        prompts, is_text, is_single = self._prompts(inputs)
        lengths, end_positions = self._generation_lengths(prompts, max_length, max_new_tokens)
        stop_ids = self._stop_token_ids(stop_token_ids)
        pad_id = stop_ids[0] if stop_ids else 0
        if self.preprocessor is not None:
            pad_id = self.preprocessor.tokenizer.end_token_id
        if sampler == "beam":
            check_beam_sampler_options(sampler_options)
            token_ids, valid = self._beam_generate(prompts, lengths, end_positions, stop_ids, pad_id, **sampler_options)
        else:
            sampler = get_sampler(sampler, **sampler_options)
            token_ids, valid = self._sample_generate(prompts, lengths, end_positions, stop_ids, pad_id, sampler, seed)
        length = int(valid.any(axis=0).nonzero()[0].max()) + 1
        token_ids, valid = token_ids[:, :length], valid[:, :length]
        if not is_text:
            return {"token_ids": token_ids, "padding_mask": valid.astype("int32")}
        tokenizer = self.preprocessor.tokenizer
        texts = [tokenizer.decode(ids[mask]) for ids, mask in zip(token_ids, valid)]
        return texts[0] if is_single else texts

    def _generation_lengths(self, prompts, max_length, max_new_tokens):
        """Checks the prompts and lengths; `(prompt lengths, end positions)`."""
        if not prompts:
            raise ValueError("generate needs at least one prompt; got an empty batch.")
        lengths = np.array([len(p) for p in prompts])
        for row, length in enumerate(lengths):
            if length == 0:
                raise ValueError(
                    f"Prompt {row} is empty: {type(self).__name__} needs at least one prompt "
                    "token to condition on (it has no start token)."
                )
        check_id_range("token_ids", np.concatenate([np.asarray(p) for p in prompts]), self.backbone.vocabulary_size)
        limit = self.max_generation_length
        if max_length is not None and max_new_tokens is not None:
            raise ValueError("Give max_length or max_new_tokens, not both.")
        if max_new_tokens is not None:
            if max_new_tokens < 0:
                raise ValueError(f"max_new_tokens must be non-negative; got {max_new_tokens}.")
            end_positions = lengths + int(max_new_tokens)
        else:
            if max_length is None:
                max_length = self._default_max_length()
            if max_length < lengths.max():
                raise ValueError(
                    f"max_length {max_length} is shorter than the longest prompt "
                    f"({int(lengths.max())} tokens)."
                )
            end_positions = np.full_like(lengths, int(max_length))
        if limit is not None and end_positions.max() > limit:
            raise ValueError(
                f"Generating to length {int(end_positions.max())} exceeds the model's "
                f"max_sequence_length {limit}."
            )
        return lengths, end_positions

    def _default_max_length(self):
        """`generate`'s `max_length` when neither it nor `max_new_tokens` is
        given: the preprocessor's `sequence_length`, at most the model's
        limit."""
        lengths = [self.max_generation_length]
        if self.preprocessor is not None:
            lengths.append(self.preprocessor.sequence_length)
        lengths = [length for length in lengths if length is not None]
        if not lengths:
            raise ValueError("Give generate a max_length or max_new_tokens: this model has no length limit.")
        return min(lengths)

    def _buffer_length(self, end_positions):
        """The generation buffer for rows ending at `end_positions`: the
        longest, rounded up to `BUFFER_MULTIPLE` (at most the model's limit)."""
        limit = self.max_generation_length
        return round_up(int(end_positions.max()), BUFFER_MULTIPLE, float("inf") if limit is None else limit)

    def _prompt_pass_length(self, prompt_length, buffer_length):
        """How many positions the pass before the decoding loop covers, for
        prompts at least `prompt_length` long: `[0, prompt_length − 1)` —
        the loop feeds position `prompt_length − 1` and every later one —
        rounded up to `PROMPT_MULTIPLE` so that new prompt lengths rarely
        recompile. A key/value cache may be rewritten (the loop rewrites the
        extra positions with the same or later tokens); a recurrent state
        must see each position once, so `_prefilled_cache` masks the extra
        positions out of it."""
        fed = prompt_length if self.decoding.position_addressed else prompt_length - 1
        return round_up(fed, PROMPT_MULTIPLE, buffer_length)

    def _prefilled_cache(self, token_ids, prompt_tokens, loop_start, constants):
        """A cache for the `(batch, buffer_length)` buffer `token_ids`, after
        the prompt pass over `prompt_tokens` `(batch, pass_length)` at
        positions `0 …` (none for an empty pass). `loop_start` (an int32
        scalar tensor) is the first position the decoding loop feeds; a
        recurrent state is given only the positions before it. `constants`
        are `_decoding_constants`."""
        cache = self.init_cache(ops.shape(token_ids)[0], ops.shape(token_ids)[1])
        pass_length = prompt_tokens.shape[1]
        if pass_length == 0:
            return cache
        padding_mask = None
        if not self.decoding.position_addressed:
            fed = ops.arange(pass_length, dtype="int32")[None, :] < loop_start
            padding_mask = ops.broadcast_to(fed, ops.shape(prompt_tokens))
        _, cache = self._decoder_pass(prompt_tokens, cache, 0, padding_mask=padding_mask, constants=constants)
        return cache

    def _sample_generate(self, prompts, lengths, end_positions, stop_ids, pad_id, sampler, seed):
        buffer_length = self._buffer_length(end_positions)
        prompt_pass_length = self._prompt_pass_length(int(lengths.min()), buffer_length)
        token_ids, prompt_mask = right_padded(prompts, buffer_length, pad_id)
        batch = len(prompts)
        uniforms = sampler_uniforms(sampler, batch, buffer_length, int(end_positions.max()), seed)

        def build():
            step = self._decoding_step()

            def run(token_ids, prompt_tokens, prompt_mask, end_positions, stop_ids, uniforms, start_index):
                constants = self._decoding_constants(token_ids.shape[1])
                cache = self._prefilled_cache(token_ids, prompt_tokens, start_index - 1, constants)
                return decode_in_place(
                    step, token_ids, prompt_mask, end_positions, stop_ids, uniforms, cache, start_index,
                    sampler, pad_id, constants=constants,
                )

            return run

        run = self._compiled(("sample", type(sampler).__name__, tuple(sampler.config().items()), pad_id), build)
        token_ids, valid = run(
            ops.convert_to_tensor(token_ids),
            ops.convert_to_tensor(token_ids[:, :prompt_pass_length]),
            ops.convert_to_tensor(prompt_mask),
            ops.convert_to_tensor(end_positions.astype("int32")),
            ops.convert_to_tensor(np.array(stop_ids or [-1], dtype="int32")),
            ops.convert_to_tensor(uniforms),
            ops.convert_to_tensor(np.int32(lengths.min())),
        )
        return np.asarray(ops.convert_to_numpy(token_ids)), np.asarray(ops.convert_to_numpy(valid))

    def _beam_generate(self, prompts, lengths, end_positions, stop_ids, pad_id, num_beams=4,
                       length_penalty=1.0, early_stopping=False):
        """Beam search for each prompt; prompts of one length are searched
        together (the length penalty counts generated tokens, so a prompt's
        result never depends on the others in the batch)."""
        num_beams, length_penalty, early_stopping = check_beam_options(num_beams, length_penalty, early_stopping)
        buffer_length = self._buffer_length(end_positions)
        token_ids, _ = right_padded(prompts, buffer_length, pad_id)
        valid = np.zeros(token_ids.shape, dtype=bool)

        def build():
            step = self._decoding_step()

            def run(token_ids, prompt_tokens, prompt_length, max_length, stop_ids):
                constants = self._decoding_constants(token_ids.shape[1])
                cache = self._prefilled_cache(token_ids, prompt_tokens, prompt_length - 1, constants)
                cache = keras.tree.map_structure(lambda t: ops.repeat(t, num_beams, axis=0), cache)
                return beam_search(
                    step, token_ids, cache, prompt_length, max_length, stop_ids,
                    num_beams, length_penalty, early_stopping, constants=constants,
                )

            return run

        run = self._compiled(("beam", num_beams, length_penalty, early_stopping), build)
        stop_tensor = ops.convert_to_tensor(np.array(stop_ids or [-1], dtype="int32"))
        for prompt_length in np.unique(lengths):
            rows = np.flatnonzero(lengths == prompt_length)
            group = token_ids[rows]
            prompt_pass_length = self._prompt_pass_length(int(prompt_length), buffer_length)
            best, best_lengths = run(
                ops.convert_to_tensor(group),
                ops.convert_to_tensor(group[:, :prompt_pass_length]),
                ops.convert_to_tensor(np.int32(prompt_length)),
                ops.convert_to_tensor(np.int32(end_positions[rows].max())),
                stop_tensor,
            )
            token_ids[rows] = np.asarray(ops.convert_to_numpy(best))
            valid[rows] = np.arange(buffer_length)[None, :] < np.asarray(ops.convert_to_numpy(best_lengths))[:, None]
        return token_ids, valid

