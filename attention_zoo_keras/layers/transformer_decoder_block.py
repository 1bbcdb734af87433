"""The Transformer decoder block (Vaswani et al., 2017, §3.1): causal
self-attention, attention over the encoder's output (cross-attention), and a
feed-forward network, each with a residual.

Post-norm, as in the paper and Marian:

    h = LayerNorm(x + Dropout(SelfAttn(x)))
    g = LayerNorm(h + Dropout(MultiHead(h, E)))
    y = LayerNorm(g + Dropout(FFN(g)))

Pre-norm (Xiong et al., 2020):

    h = x + Dropout(SelfAttn(LayerNorm(x)))
    g = h + Dropout(MultiHead(LayerNorm(h), E))
    y = g + Dropout(FFN(LayerNorm(g)))

with `E` the encoder's output. The self-attention mechanism is pluggable
(`attention=`); cross-attention is softmax attention.
"""

from attention_zoo_keras.layers.transformer_encoder_block import TransformerEncoderBlock
from attention_zoo_keras.registration import register


@register
class TransformerDecoderBlock(TransformerEncoderBlock):
    """Causal self-attention, cross-attention and a feed-forward network.

    Takes the arguments of `TransformerEncoderBlock` (`is_causal` defaults
    to `True` here); `attention` and `attention_options` choose the
    self-attention mechanism.

    Call args:
        x: tensor of shape `(batch, target_length, hidden_dim)`. The
            decoder's hidden states.
        encoder_output: tensor of shape
            `(batch, source_length, encoder_dim)` or None. The encoder's
            output; or pass `encoder_key_value` instead.
        attention_mask: bool tensor of shape
            `(batch, 1 or target_length, target_length)` or None. The mask
            of the self-attention (the causal mask is added); with a cache,
            over absolute positions.
        encoder_attention_mask: bool tensor of shape
            `(batch, 1 or target_length, source_length)` or None. `True` on
            real source tokens.
        encoder_key_lengths: int tensor of shape `(batch,)` or None.
            Instead of `encoder_attention_mask`, for right-padded sources:
            each row's number of source tokens (see `MultiHeadAttention`'s
            `key_lengths`).
        cache: tuple of tensors or None. The decoding cache of the
            self-attention (see `MultiHeadAttention`); the block then
            returns `(y, new_cache)`.
        cache_update_index: int or int tensor. The position of `x`'s first
            token in the cache.
        encoder_key_value: tuple of two tensors or None. The
            cross-attention's keys and values of the encoder's output, from
            `cross_attention.project_key_value`: decoding computes them once
            per source, not at every step.

    Example:

    >>> import numpy as np
    >>> block = TransformerDecoderBlock(num_heads=2, intermediate_dim=16)
    >>> tuple(block(np.zeros((1, 3, 8), "float32"), np.zeros((1, 5, 8), "float32")).shape)
    (1, 3, 8)
    """

    def __init__(self, num_heads, intermediate_dim, is_causal=True, **kwargs):
        super().__init__(num_heads, intermediate_dim, is_causal=is_causal, **kwargs)
        self.cross_attention_norm = self._layer_norm("cross_attention_norm")
        self.cross_attention_output_dropout = self._dropout("cross_attention_output_dropout")
        self.cross_attention = None

    def build(self, x_shape, encoder_output_shape=None):
        super().build(x_shape)
        encoder_output_shape = x_shape if encoder_output_shape is None else encoder_output_shape
        self.cross_attention = self._attention_layer(x_shape[-1], "cross_attention")
        self.cross_attention.build(x_shape, encoder_output_shape)
        self.cross_attention_norm.build(x_shape)

    def _cross_attention_sublayer(
        self, x, encoder_output, encoder_key_value, encoder_attention_mask, training, encoder_key_lengths=None
    ):
        def attend(h):
            attended = self.cross_attention(
                h,
                encoder_output,
                attention_mask=encoder_attention_mask,
                key_lengths=encoder_key_lengths,
                training=training,
                key_value=encoder_key_value,
            )
            return self.cross_attention_output_dropout(attended, training=training)

        return self._residual(x, self.cross_attention_norm, attend)

    def call(
        self,
        x,
        encoder_output=None,
        attention_mask=None,
        encoder_attention_mask=None,
        training=None,
        cache=None,
        cache_update_index=None,
        encoder_key_value=None,
        encoder_key_lengths=None,
    ):
        if (encoder_output is None) == (encoder_key_value is None):
            raise ValueError("TransformerDecoderBlock takes encoder_output or encoder_key_value (one of them).")
        h, new_cache = self._self_attention_sublayer(x, attention_mask, training, cache, cache_update_index)
        g = self._cross_attention_sublayer(
            h, encoder_output, encoder_key_value, encoder_attention_mask, training, encoder_key_lengths
        )
        y = self._feed_forward_sublayer(g, training)
        if cache is not None:
            return y, new_cache
        return y
