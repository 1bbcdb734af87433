"""What decoder-only language models share: `GenerativeTask.generate` from
prompts, with a decoding cache filled by one pass over the prompts.

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
from attention_zoo_keras.generation.cache_growth import layer_cache_growth
from attention_zoo_keras.models.decoding_step_model import DecodingStepModel
from attention_zoo_keras.models.generation_request import dict_prompt_arrays
from attention_zoo_keras.models.generation_request import new_token_counts
from attention_zoo_keras.models.generative_task import GenerativeTask
from attention_zoo_keras.models.generative_task import round_up
from attention_zoo_keras.models.input_validation import check_id_range
from attention_zoo_keras.models.text_preprocessor import as_text_list

# Prompt passes are rounded up to this multiple so that prompts of similar
# lengths reuse one compiled program.
PROMPT_MULTIPLE = 16


class CausalLM(GenerativeTask):
    """A decoder-only language model that generates (see `GPTCausalLM`,
    `TransformerXLCausalLM`); `generate` is `GenerativeTask.generate`."""

    def validate_labels(self, labels, inputs=None):
        """Labels are next-token ids, in the vocabulary."""
        check_id_range("labels", labels, self.backbone.vocabulary_size)

    def decoding_step_model(self, batch_size=1, max_length=None):
        """This model's one-token decoding step as a Keras model of its own
        (sharing these weights), to export for a serving runtime that runs
        the generation loop itself: `step.export(path, format="litert")`
        (or `"onnx"`, `"tf_saved_model"`). See `DecodingStepModel`.

        Args:
            batch_size: int. The rows decoded together.
            max_length: int or None. The positions the cache holds; by
                default the model's limit.

        Example:

        >>> step = lm.decoding_step_model(batch_size=1, max_length=64)       # doctest: +SKIP
        >>> outputs = step({"token_ids": [[464]], "index": [0], **step.empty_cache()})  # doctest: +SKIP
        >>> outputs["logits"].shape                                          # doctest: +SKIP
        (1, 50257)
        """
        max_length = max_length or self.max_generation_length
        if max_length is None:
            raise ValueError("Give decoding_step_model a max_length: this model has no length limit.")
        if self.max_generation_length is not None and max_length > self.max_generation_length:
            raise ValueError(
                f"max_length {max_length} is longer than the model's limit of {self.max_generation_length} positions."
            )
        return DecodingStepModel(self, batch_size, max_length, name=f"{self.name}_decoding_step")

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

    def _cache_growth(self):
        """Every layer's cache grown by its mechanism (`None` for a recurrent
        state); a step reads every weight."""
        attention_layers = [block.self_attention for block in self.backbone.transformer_layers]
        return layer_cache_growth(attention_layers, self.weights)

    def _prompts(self, inputs):
        """`(list of id lists, is_text, is_single)` from raw text or a dict."""
        preprocessor = self.preprocessor
        if isinstance(inputs, dict):
            token_ids, mask = dict_prompt_arrays(inputs, "token_ids", "padding_mask", "Prompt")
            return [[int(i) for i in ids[valid]] for ids, valid in zip(token_ids, mask)], False, False
        if preprocessor is None or not preprocessor.is_raw(inputs):
            raise TypeError(
                "generate takes raw strings (with a preprocessor) or a dict of token_ids and "
                f"padding_mask; got {type(inputs).__name__}."
            )
        prompts = preprocessor.tokenizer.encode(as_text_list(inputs))
        return prompts, True, isinstance(inputs, str)

    def _prepare_generation(self, inputs, max_length, max_new_tokens, stop_ids):
        """The prompts right-padded with the end token (without a
        preprocessor, the first stop id, or 0), each row ending at
        `max_length` or `max_new_tokens` after its prompt."""
        prompts, is_text, is_single = self._prompts(inputs)
        end_positions = self._generation_lengths(prompts, max_length, max_new_tokens)
        pad_id = stop_ids[0] if stop_ids else 0
        if self.preprocessor is not None:
            pad_id = self.preprocessor.tokenizer.end_token_id
        return self._request(prompts, end_positions, stop_ids, pad_id, is_text=is_text, is_single=is_single)

    def _generation_lengths(self, prompts, max_length, max_new_tokens):
        """Checks the prompts and lengths; returns each row's end position."""
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
        if max_new_tokens is not None:
            end_positions = lengths + new_token_counts(max_new_tokens, len(prompts))
        else:
            longest = int(lengths.max())
            if max_length is None:
                max_length = self._default_max_length()
                if max_length < longest:
                    raise ValueError(
                        f"The default max_length, {max_length} (the preprocessor's sequence_length or the model's "
                        f"limit), is shorter than the longest prompt ({longest} tokens); give max_new_tokens or a "
                        "longer max_length."
                    )
            if max_length < longest:
                raise ValueError(f"max_length {max_length} is shorter than the longest prompt ({longest} tokens).")
            end_positions = np.full_like(lengths, int(max_length))
        if limit is not None and end_positions.max() > limit:
            raise ValueError(
                f"Generating to length {int(end_positions.max())} exceeds the model's "
                f"max_sequence_length {limit}."
            )
        return end_positions

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

    def _decoding_inputs(self, request, rows, buffer_length, prompt_length):
        """The prompt pass's tokens of `rows` (see `_prompt_pass_length`)."""
        return (request.token_ids[rows, : self._prompt_pass_length(prompt_length, buffer_length)],)

    def _start_index_bound(self, inputs, token_ids):
        """One past the prompt pass's length: the pass writes the positions
        before that length, and the loop starts at most one position after
        the last it covers (`_prompt_pass_length`)."""
        (prompt_tokens,) = inputs
        return int(prompt_tokens.shape[1]) + 1

    def _start_decoding(self, inputs, token_ids, start_index, num_beams):
        """The cache after the prompt pass (repeated for `num_beams` rows
        per prompt) and `_decoding_constants`."""
        (prompt_tokens,) = inputs
        constants = self._decoding_constants(token_ids.shape[1])
        cache = self._prefilled_cache(token_ids, prompt_tokens, start_index - 1, constants)
        if num_beams > 1:
            cache = keras.tree.map_structure(lambda t: ops.repeat(t, num_beams, axis=0), cache)
        return cache, constants
