"""The Transformer encoder block (Vaswani et al., 2017, §3.1), post- or pre-norm.

Post-norm, as in the original Transformer and BERT:

    h = LayerNorm(x + Dropout(MultiHead(x, x)))
    y = LayerNorm(h + Dropout(FFN(h)))

Pre-norm (Xiong et al., 2020, "On Layer Normalization in the Transformer
Architecture"), as in GPT-2 and ViT:

    h = x + Dropout(MultiHead(LayerNorm(x)))
    y = h + Dropout(FFN(LayerNorm(h)))
"""

import keras

from attention_zoo_keras.layers.fused_keras_layers import LayerNormalization
from attention_zoo_keras.layers.initializers import clone_initializer
from attention_zoo_keras.layers.feed_forward import FeedForward
from attention_zoo_keras.layers.multi_head_attention import MultiHeadAttention
from attention_zoo_keras.registration import register


@register
class TransformerEncoderBlock(keras.layers.Layer):
    """Self-attention and a feed-forward network, each with a residual.

    Args:
        num_heads: int. The number of attention heads.
        intermediate_dim: int. The feed-forward width.
        head_dim: int or None. The per-head size; `None`:
            `hidden_dim // num_heads`.
        activation: str. The feed-forward activation's name.
        dropout: float. Dropout on each residual branch.
        attention_dropout: float. Dropout on the attention probabilities.
        layer_norm_epsilon: float. The epsilon of both layer norms.
        norm_first: bool. `False` for post-norm (BERT), `True` for
            pre-norm.
        is_causal: bool. Mask out future positions (decoder-only models).
        attention: str. The attention mechanism's name.
        attention_options: dict or None. The mechanism's options (see
            `MultiHeadAttention`).
        kernel_initializer: str or keras.initializers.Initializer. The
            initializer of every kernel.

    Call args:
        x: tensor of shape `(batch, length, hidden_dim)`. The block's
            input.
        attention_mask: bool tensor of shape `(batch, 1 or length, length)`
            or None. With a cache, `(batch, 1 or length, positions)` over
            absolute positions.
        key_lengths: int tensor of shape `(batch,)` or None. Instead of
            `attention_mask`, without a cache: row b's positions see its
            first `key_lengths[b]` (right-padded rows; see
            `MultiHeadAttention`).
        cache: tuple of tensors or None. The decoding cache of this block's
            self-attention, the mechanism's (a `(key_cache, value_cache)`
            pair for softmax, the recurrent state `(S, z)` for linear; see
            `MultiHeadAttention`); the block then returns `(y, new_cache)`.
        cache_update_index: int or int tensor. The position of `x`'s first
            token in the cache.

    Example:

    >>> import numpy as np
    >>> block = TransformerEncoderBlock(num_heads=2, intermediate_dim=16)
    >>> tuple(block(np.zeros((1, 3, 8), "float32")).shape)
    (1, 3, 8)
    """

    def __init__(
        self,
        num_heads,
        intermediate_dim,
        head_dim=None,
        activation="gelu",
        dropout=0.0,
        attention_dropout=0.0,
        layer_norm_epsilon=1e-5,
        norm_first=False,
        is_causal=False,
        attention="softmax",
        attention_options=None,
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_heads = num_heads
        self.intermediate_dim = intermediate_dim
        self.head_dim = head_dim
        self.activation = activation
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.layer_norm_epsilon = layer_norm_epsilon
        self.norm_first = norm_first
        self.is_causal = is_causal
        self.attention = attention
        self.attention_options = dict(attention_options or {})
        self.kernel_initializer = keras.initializers.get(kernel_initializer)

        self.attention_norm = self._layer_norm("attention_norm")
        self.output_norm = self._layer_norm("output_norm")
        self.feed_forward = FeedForward(
            intermediate_dim,
            activation=activation,
            kernel_initializer=clone_initializer(kernel_initializer),
            dtype=self.dtype_policy,
            name="feed_forward",
        )
        self.attention_output_dropout = self._dropout("attention_output_dropout")
        self.feed_forward_dropout = self._dropout("feed_forward_dropout")
        self.self_attention = None

    def _layer_norm(self, name):
        return LayerNormalization(epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy, name=name)

    def _dropout(self, name):
        """Dropout on a residual branch."""
        return keras.layers.Dropout(self.dropout, dtype=self.dtype_policy, name=name)

    def _attention_layer(self, hidden_dim, name, attention="softmax", attention_options=None, use_bias=True):
        """A `MultiHeadAttention` of this block's heads, dropout and initializer
        (`use_bias`: whether its projections have biases)."""
        if self.head_dim is None and hidden_dim % self.num_heads:
            raise ValueError(
                f"hidden_dim {hidden_dim} is not divisible by num_heads {self.num_heads}; "
                "pass head_dim explicitly."
            )
        return MultiHeadAttention(
            num_heads=self.num_heads,
            head_dim=self.head_dim or hidden_dim // self.num_heads,
            attention=attention,
            attention_options=attention_options,
            dropout=self.attention_dropout,
            use_bias=use_bias,
            kernel_initializer=clone_initializer(self.kernel_initializer),
            dtype=self.dtype_policy,
            name=name,
        )

    def build(self, input_shape):
        self.self_attention = self._attention_layer(
            input_shape[-1], "self_attention", self.attention, self.attention_options
        )
        self.self_attention.build(input_shape)
        self.attention_norm.build(input_shape)
        self.feed_forward.build(input_shape)
        self.output_norm.build(input_shape)

    def _residual(self, x, norm, branch):
        """`x` plus `branch`, normalised before the branch (pre-norm) or
        after the sum (post-norm)."""
        if self.norm_first:
            return x + branch(norm(x))
        return norm(x + branch(x))

    def _self_attention_sublayer(self, x, attention_mask, training, cache, cache_update_index, key_lengths=None):
        """The self-attention residual sublayer; `(h, updated cache or None)`."""
        new_cache = []

        def attend(h):
            if cache is None:
                attended = self.self_attention(
                    h, attention_mask=attention_mask, key_lengths=key_lengths, is_causal=self.is_causal,
                    training=training,
                )
            else:
                attended, updated = self.self_attention(
                    h,
                    attention_mask=attention_mask,
                    key_lengths=key_lengths,
                    is_causal=self.is_causal,
                    training=training,
                    cache=cache,
                    cache_update_index=cache_update_index,
                )
                new_cache.append(updated)
            return self.attention_output_dropout(attended, training=training)

        h = self._residual(x, self.attention_norm, attend)
        return h, (new_cache[0] if new_cache else None)

    def _feed_forward_sublayer(self, x, training):
        def feed_forward(h):
            return self.feed_forward_dropout(self.feed_forward(h), training=training)

        return self._residual(x, self.output_norm, feed_forward)

    def call(self, x, attention_mask=None, training=None, cache=None, cache_update_index=None, key_lengths=None):
        h, new_cache = self._self_attention_sublayer(
            x, attention_mask, training, cache, cache_update_index, key_lengths=key_lengths
        )
        y = self._feed_forward_sublayer(h, training)
        if cache is not None:
            return y, new_cache
        return y

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "intermediate_dim": self.intermediate_dim,
                "head_dim": self.head_dim,
                "activation": self.activation,
                "dropout": self.dropout,
                "attention_dropout": self.attention_dropout,
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "norm_first": self.norm_first,
                "is_causal": self.is_causal,
                "attention": self.attention,
                "attention_options": self.attention_options,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            }
        )
        return config
