"""The Reformer language model (Kitaev et al., 2020): next-token logits from
the concatenated streams,

    logits = [Y1 ; Y2]_normed W + b       (W: 2·d × vocabulary)

The bias `b` is the original model's (trax, and `transformers` 4.x add
it); `transformers` 5.x ignores its `lm_head.bias` (a regression), so its
logits equal these only where that bias is zero.

**Generation** follows `transformers`' Reformer decoding, so that greedy
generation gives the same tokens:

- one pass over the prompt, padded as `ReformerBackbone` pads at
  inference (`padded_length`), gives the logits of the first new token
  and fills every layer's cache: a key/value cache for local attention,
  for LSH attention its vectors and buckets (`attention.lsh`'s decoding
  cache). LSH decoding depends on where the prompt pass ends, so prompts
  of different lengths are generated apart (each row's result is the one
  it gets alone);
- then one token at a time: local attention over the last chunks, LSH
  attention over the chunk of the sorted cache the new token hashes into.

The hashing rotations stay fixed for a whole generation (the LSH `seed`
option, or a fixed default), where `transformers` without `hash_seed` draws
new ones at every step.
"""

import math

import keras
from keras import ops

from attention_zoo_keras.layers.fused_keras_layers import Dense
from attention_zoo_keras.losses.token_cross_entropy import token_cross_entropy
from attention_zoo_keras.models.causal_lm import CausalLM
from attention_zoo_keras.models.generative_task import BUFFER_MULTIPLE
from attention_zoo_keras.models.generative_task import round_up
from attention_zoo_keras.models.reformer.reformer_backbone import ReformerBackbone
from attention_zoo_keras.models.reformer.reformer_chunk_padding import padded_length
from attention_zoo_keras.models.reformer.reformer_causal_lm_preprocessor import ReformerCausalLMPreprocessor
from attention_zoo_keras.optimizers.fused_adam import FusedAdam
from attention_zoo_keras.registration import register


def language_model_head(backbone):
    """The Dense layer `lm_head` (`2·d → vocabulary`, with bias) of the
    Reformer's language models (transformers' `ReformerOnlyLMHead`)."""
    return Dense(
        backbone.vocabulary_size,
        kernel_initializer=keras.initializers.RandomNormal(stddev=backbone.initializer_range),
        dtype=backbone.dtype_policy,
        name="lm_head",
    )


def language_model_compile_arguments():
    """`compile()`'s defaults for the Reformer's language models."""
    return {
        "optimizer": FusedAdam(1e-4),
        "loss": token_cross_entropy(),
        "weighted_metrics": [keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
    }


@register
class ReformerCausalLM(CausalLM):
    """Predicts the next token at every position.

    Args:
        backbone: `ReformerBackbone`. A causal one.
        preprocessor: `ReformerCausalLMPreprocessor` or None. So `fit` takes
            raw text.

    Inputs: the backbone's `token_ids` and `padding_mask`. Output: logits
    `(batch, length, vocabulary_size)`.

    Training needs sequences whose length is a multiple of the chunk
    lengths (and, with axial positions, exactly `n₁·n₂` long). `generate`
    takes the arguments of every generative task (see
    `GenerativeTask.generate`).

    Example:

    >>> lm = ReformerCausalLM.from_preset("reformer_crime_and_punishment")   # doctest: +SKIP
    >>> lm.generate("A few months later", max_length=100)                    # doctest: +SKIP
    """

    backbone_cls = ReformerBackbone
    preprocessor_cls = ReformerCausalLMPreprocessor
    # LSH decoding depends on where the prompt pass ends (see the module docstring).
    decodes_prompt_lengths_apart = True

    def __init__(self, backbone, preprocessor=None, **kwargs):
        if not backbone.is_causal:
            raise ValueError("ReformerCausalLM needs a causal backbone (is_causal=True).")
        inputs = dict(backbone.input)
        head = language_model_head(backbone)
        logits = head(backbone(inputs)["sequence_output"])
        super().__init__(inputs=inputs, outputs=logits, backbone=backbone, preprocessor=preprocessor, **kwargs)
        self.lm_head = head

    def default_compile_arguments(self):
        return language_model_compile_arguments()

    @property
    def max_generation_length(self):
        """The number of positions."""
        return self.backbone.max_sequence_length

    # -- generation ----------------------------------------------------------

    def init_cache(self, batch_size, max_length):
        """An empty decoding cache: per layer, its attention mechanism's
        `initial_cache` (a key/value cache for local attention; vectors,
        buckets and a flag for LSH)."""
        return tuple(
            branch.self_attention.initial_cache(batch_size, max_length) for branch in self.backbone.attention_branches
        )

    def _cache_growth(self):
        """None: the caches keep the buffer's size (LSH attention's hashes
        and the local chunks are laid out for it)."""
        return None

    def _buffer_length(self, end_positions):
        """Room for the prompt pass too, which is padded to a multiple of the
        chunk lengths."""
        multiple = math.lcm(BUFFER_MULTIPLE, *self.backbone.chunk_lengths)
        return round_up(int(end_positions.max()), multiple, self.max_generation_length)

    def _prompt_pass_length(self, prompt_length, buffer_length):
        """The whole prompt, padded as the backbone pads at inference (or to
        the shortest chunk length, which changes nothing: up to it every
        layer attends over all positions)."""
        chunk_lengths = self.backbone.chunk_lengths
        length = padded_length(prompt_length, chunk_lengths)
        if chunk_lengths and length <= min(chunk_lengths):
            length = min(min(chunk_lengths), buffer_length)
        if length > buffer_length:
            raise ValueError(
                f"The prompt of {prompt_length} tokens, padded to {length} for the chunk lengths "
                f"{chunk_lengths}, exceeds the model's {buffer_length} positions."
            )
        return length

    def _decoder_pass(self, token_ids, cache, cache_update_index, padding_mask=None, constants=()):
        """The reversible layers over new tokens, without recomputation;
        `(normed [Y1; Y2], updated cache)`."""
        backbone = self.backbone
        x, attention_mask = self._new_token_embeddings(token_ids, cache_update_index, padding_mask)
        y1 = y2 = x
        caches = []
        for attention, feed_forward, layer_cache in zip(
            backbone.attention_branches, backbone.feed_forward_branches, cache
        ):
            attended, layer_cache = attention(
                y2, attention_mask=attention_mask, cache=layer_cache, cache_update_index=cache_update_index
            )
            y1 = y1 + attended
            y2 = y2 + feed_forward(y1)
            caches.append(layer_cache)
        return backbone.final_norm(ops.concatenate([y1, y2], axis=-1)), tuple(caches)

    def _prefilled_cache(self, token_ids, prompt_tokens, loop_start, constants):
        """`(layer caches, logits after position loop_start, loop_start)`:
        the prompt pass over `prompt_tokens`, of which positions up to
        `loop_start` are real and the rest padding, gives the logits the
        decoding loop starts from (see `_decoding_step`)."""
        batch, buffer_length = ops.shape(token_ids)[0], ops.shape(token_ids)[1]
        real = ops.arange(buffer_length, dtype="int32")[None, :] <= loop_start
        padding_mask = ops.broadcast_to(real, (batch, buffer_length))
        hidden, cache = self._decoder_pass(
            prompt_tokens, self.init_cache(batch, buffer_length), 0, padding_mask=padding_mask
        )
        first_logits = self.lm_head(ops.take(hidden, loop_start, axis=1))
        return cache, first_logits, ops.full((batch,), loop_start, dtype="int32")

    def _next_token_logits(self, token_column, cache, index, *constants):
        """One decoding step over the layer caches: logits `(batch,
        vocabulary)` after the token at `index`, and the extended caches."""
        hidden, cache = self._decoder_pass(token_column, cache, index)
        return self.lm_head(hidden[:, 0, :]), cache

    def _decoding_step(self, recorded=True):
        """The loop's step: at the last prompt position, the prompt pass's
        logits (that position is in the caches already, as the full pass
        computed it); after it, `_next_token_logits` (recorded if
        `recorded`)."""
        model_step = super()._decoding_step(recorded)

        def step(token_column, cache, index, *constants):
            layer_caches, first_logits, first_index = cache
            logits, layer_caches = ops.cond(
                ops.equal(index, first_index[0]),
                lambda: (first_logits, layer_caches),
                lambda: model_step(token_column, layer_caches, index, *constants),
            )
            return logits, (layer_caches, first_logits, first_index)

        return step
