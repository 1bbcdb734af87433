"""GPT-2 with its language-model head: next-token logits from the hidden
states and the (tied) token embedding matrix,

    logits = H Eᵀ     (no bias)
"""

import keras

from attention_zoo_keras.layers.tied_lm_head import TiedLMHead
from attention_zoo_keras.losses.token_cross_entropy import token_cross_entropy
from attention_zoo_keras.models.causal_lm import CausalLM
from attention_zoo_keras.models.gpt.gpt_backbone import GPTBackbone
from attention_zoo_keras.models.gpt.gpt_causal_lm_preprocessor import GPTCausalLMPreprocessor
from attention_zoo_keras.optimizers.fused_adam import FusedAdamW
from attention_zoo_keras.registration import register


@register
class GPTCausalLM(CausalLM):
    """Predicts the next token at every position.

    Args:
        backbone: `GPTBackbone`. The decoder.
        preprocessor: `GPTCausalLMPreprocessor` or None. So `fit` takes raw
            text.

    Inputs: the backbone's `token_ids` and `padding_mask`. Output: logits
    `(batch, length, vocabulary_size)`, float32 only if the backbone is.
    `generate` takes the arguments of every generative task (see
    `GenerativeTask.generate`), up to `max_sequence_length` tokens.

    Example:

    >>> lm = GPTCausalLM.from_preset("gpt2")                        # doctest: +SKIP
    >>> lm.fit(["some text to continue pretraining on"], epochs=1)  # doctest: +SKIP
    >>> lm.generate("The meaning of life is", max_new_tokens=8)     # doctest: +SKIP
    """

    backbone_cls = GPTBackbone
    preprocessor_cls = GPTCausalLMPreprocessor

    def __init__(self, backbone, preprocessor=None, **kwargs):
        inputs = dict(backbone.input)
        head = TiedLMHead(backbone.token_embedding, dtype=backbone.dtype_policy, name="lm_head")
        logits = head(backbone(inputs)["sequence_output"])
        super().__init__(inputs=inputs, outputs=logits, backbone=backbone, preprocessor=preprocessor, **kwargs)
        self.lm_head = head

    def default_compile_arguments(self):
        return {
            "optimizer": FusedAdamW(5e-5, weight_decay=0.01),
            "loss": token_cross_entropy(),
            "weighted_metrics": [keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
        }

    @property
    def max_generation_length(self):
        """The number of learned positions."""
        return self.backbone.max_sequence_length

    def _decoding_constants(self, buffer_length):
        """The tied output matrix `Eᵀ`, laid out once (`TiedLMHead.output_kernel`)."""
        return (self.lm_head.output_kernel(self.backbone.compute_dtype),)

    def _decoder_pass(self, token_ids, cache, cache_update_index, padding_mask=None, constants=()):
        """The decoder blocks over new tokens; `(hidden before the final
        norm, updated cache)`."""
        backbone = self.backbone
        x, attention_mask = self._new_token_embeddings(token_ids, cache_update_index, padding_mask)
        caches = []
        for block, layer_cache in zip(backbone.transformer_layers, cache):
            x, layer_cache = block(
                x, attention_mask=attention_mask, cache=layer_cache, cache_update_index=cache_update_index
            )
            caches.append(layer_cache)
        return x, tuple(caches)

    def call_with_cache(self, token_ids, cache, cache_update_index, padding_mask=None):
        """One forward pass over new tokens, reusing and extending `cache`.

        With a cache that is not position-addressed (linear attention's
        recurrent state) every position must be passed exactly once, in
        order: the state cannot forget a position.

        Args:
            token_ids: int tensor of shape `(batch, new_length)`. The ids at
                positions `cache_update_index, …, cache_update_index +
                new_length − 1`.
            cache: tuple. One cache per block, from `init_cache` (or a
                previous call).
            cache_update_index: int or int scalar tensor. The position of the
                first new token.
            padding_mask: tensor of shape `(batch, max_length)` or None. True
                where a position holds a real token (attention is causal
                anyway, so right-padded prompts need none).

        Returns:
            `(logits, hidden, cache)`: logits `(batch, new_length, vocab)`,
            the final hidden states `(batch, new_length, hidden_dim)` and
            the updated cache.
        """
        x, cache = self._decoder_pass(token_ids, cache, cache_update_index, padding_mask)
        hidden = self.backbone.final_norm(x)
        return self.lm_head(hidden), hidden, cache

    def _next_token_logits(self, token_column, cache, index, output_kernel):
        """The decoding step: logits `(batch, vocabulary)` after the tokens
        `(batch, 1)` at `index`, and the extended cache; `output_kernel` is
        `lm_head.output_kernel(...)`, computed once per generation."""
        x, cache = self._decoder_pass(token_column, cache, index)
        hidden = self.backbone.final_norm(x)[:, 0, :]
        return self.lm_head(hidden, output_kernel=output_kernel), cache
