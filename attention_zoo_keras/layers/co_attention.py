"""The co-attentional Transformer layer of ViLBERT (Lu et al., 2019,
"ViLBERT: Pretraining Task-Agnostic Visiolinguistic Representations for
Vision-and-Language Tasks", §3.1, Fig. 2b).

Two streams, text `T` (width `d_t`) and regions `V` (width `d_v`), exchange
keys and values: each stream's queries attend over the *other* stream, in a
shared co-attention width `d_c` (`num_heads` heads of `d_c / num_heads`):

    A_T = Attention(T W_Q^T, V W_K^V, V W_V^V) W_O^T        (d_c → d_t)
    A_V = Attention(V W_Q^V, T W_K^T, T W_V^T) W_O^V        (d_c → d_v)
    H_T = LayerNorm(T + Dropout(A_T))
    H_V = LayerNorm(V + Dropout(A_V))
    T'  = LayerNorm(H_T + Dropout(FFN_T(H_T)))
    V'  = LayerNorm(H_V + Dropout(FFN_V(H_V)))

Text queries attend only to real regions (the region mask), region queries
only to real tokens (the text padding mask). Both cross-attentions read the
layer's *inputs*: the two streams are updated simultaneously, not one after
the other. Each stream then has its own post-norm feed-forward sublayer, as
in the second half of a BERT layer.
"""

import keras

from attention_zoo_keras.layers.feed_forward import FeedForward
from attention_zoo_keras.layers.fused_keras_layers import LayerNormalization
from attention_zoo_keras.layers.initializers import clone_initializer
from attention_zoo_keras.layers.multi_head_attention import MultiHeadAttention
from attention_zoo_keras.registration import register


@register
class CoAttentionBlock(keras.layers.Layer):
    """ViLBERT's co-attentional Transformer layer over a text and a visual stream.

    Args:
        num_heads: int. The heads of each cross-attention.
        co_attention_dim: int. The width the queries, keys and values of
            both cross-attentions are projected to (ViLBERT's
            `bi_hidden_size`); it may differ from both streams' widths.
        text_intermediate_dim: int. The feed-forward width of the text
            stream.
        visual_intermediate_dim: int. The feed-forward width of the visual
            stream.
        text_activation: str. The feed-forward activation of the text
            stream (a name from `layers.activations`).
        visual_activation: str. The feed-forward activation of the visual
            stream.
        text_dropout: float. Dropout on the text stream's residual
            branches.
        visual_dropout: float. Dropout on the visual stream's residual
            branches.
        text_attention_dropout: float. Dropout on the attention
            probabilities over text tokens (the region queries' attention).
        visual_attention_dropout: float. Dropout on the attention
            probabilities over regions (the text queries' attention).
        layer_norm_epsilon: float. The epsilon of the four layer norms.
        kernel_initializer: str or keras.initializers.Initializer. The
            initializer of every kernel.

    Call args:
        text: tensor of shape `(batch, text_length, text_dim)`. The text
            stream.
        visual: tensor of shape `(batch, num_regions, visual_dim)`. The
            visual stream.
        text_attention_mask: bool tensor of shape `(batch, 1, text_length)`
            or None. `True` on real tokens; the keys the region queries may
            attend to.
        visual_attention_mask: bool tensor of shape
            `(batch, 1, num_regions)` or None. `True` on real regions; the
            keys the text queries may attend to.

    Returns:
        The pair `(text, visual)` of updated streams, same shapes as the inputs.

    Example:

    >>> import numpy as np
    >>> block = CoAttentionBlock(num_heads=2, co_attention_dim=8,
    ...                          text_intermediate_dim=16, visual_intermediate_dim=12)
    >>> text, visual = block(np.zeros((1, 5, 12), "float32"), np.zeros((1, 3, 6), "float32"))
    >>> tuple(text.shape), tuple(visual.shape)
    ((1, 5, 12), (1, 3, 6))
    """

    def __init__(
        self,
        num_heads,
        co_attention_dim,
        text_intermediate_dim,
        visual_intermediate_dim,
        text_activation="gelu",
        visual_activation="gelu",
        text_dropout=0.0,
        visual_dropout=0.0,
        text_attention_dropout=0.0,
        visual_attention_dropout=0.0,
        layer_norm_epsilon=1e-12,
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        if co_attention_dim % num_heads:
            raise ValueError(
                f"co_attention_dim {co_attention_dim} is not divisible by num_heads {num_heads}."
            )
        self.num_heads = num_heads
        self.co_attention_dim = co_attention_dim
        self.text_intermediate_dim = text_intermediate_dim
        self.visual_intermediate_dim = visual_intermediate_dim
        self.text_activation = text_activation
        self.visual_activation = visual_activation
        self.text_dropout = text_dropout
        self.visual_dropout = visual_dropout
        self.text_attention_dropout = text_attention_dropout
        self.visual_attention_dropout = visual_attention_dropout
        self.layer_norm_epsilon = layer_norm_epsilon
        self.kernel_initializer = keras.initializers.get(kernel_initializer)

        def dropout(rate, name):
            return keras.layers.Dropout(rate, dtype=self.dtype_policy, name=name)

        def layer_norm(name):
            return LayerNormalization(
                epsilon=layer_norm_epsilon, dtype=self.dtype_policy, name=name
            )

        def feed_forward(intermediate_dim, activation, name):
            return FeedForward(
                intermediate_dim,
                activation=activation,
                kernel_initializer=clone_initializer(self.kernel_initializer),
                dtype=self.dtype_policy,
                name=name,
            )

        self.text_attention_output_dropout = dropout(text_dropout, "text_attention_output_dropout")
        self.visual_attention_output_dropout = dropout(visual_dropout, "visual_attention_output_dropout")
        self.text_feed_forward_dropout = dropout(text_dropout, "text_feed_forward_dropout")
        self.visual_feed_forward_dropout = dropout(visual_dropout, "visual_feed_forward_dropout")
        self.text_attention_norm = layer_norm("text_attention_norm")
        self.visual_attention_norm = layer_norm("visual_attention_norm")
        self.text_output_norm = layer_norm("text_output_norm")
        self.visual_output_norm = layer_norm("visual_output_norm")
        self.text_feed_forward = feed_forward(text_intermediate_dim, text_activation, "text_feed_forward")
        self.visual_feed_forward = feed_forward(visual_intermediate_dim, visual_activation, "visual_feed_forward")
        self.text_cross_attention = None
        self.visual_cross_attention = None

    def stream_layers(self, stream):
        """The sublayers that compute one stream's output (`"text"`: `T'`,
        `"visual"`: `V'`): its queries' cross-attention, its two layer norms,
        its feed-forward sublayer and their dropouts. A model that reads
        only the other stream's output does not depend on them."""
        if stream not in ("text", "visual"):
            raise ValueError(f"stream must be 'text' or 'visual'; got {stream!r}.")
        return [
            getattr(self, f"{stream}_{part}")
            for part in ("cross_attention", "attention_output_dropout", "attention_norm", "feed_forward",
                         "feed_forward_dropout", "output_norm")
        ]

    def _cross_attention(self, output_dim, dropout, name):
        """Queries of one stream over the other's keys and values, in
        `co_attention_dim`, projected back to `output_dim`."""
        return MultiHeadAttention(
            num_heads=self.num_heads,
            head_dim=self.co_attention_dim // self.num_heads,
            output_dim=output_dim,
            dropout=dropout,
            kernel_initializer=clone_initializer(self.kernel_initializer),
            dtype=self.dtype_policy,
            name=name,
        )

    def build(self, text_shape, visual_shape):
        text_dim, visual_dim = text_shape[-1], visual_shape[-1]
        self.text_cross_attention = self._cross_attention(
            text_dim, self.visual_attention_dropout, "text_cross_attention"
        )
        self.text_cross_attention.build(text_shape, visual_shape)
        self.visual_cross_attention = self._cross_attention(
            visual_dim, self.text_attention_dropout, "visual_cross_attention"
        )
        self.visual_cross_attention.build(visual_shape, text_shape)
        for norm in (self.text_attention_norm, self.text_output_norm):
            norm.build(text_shape)
        for norm in (self.visual_attention_norm, self.visual_output_norm):
            norm.build(visual_shape)
        self.text_feed_forward.build(text_shape)
        self.visual_feed_forward.build(visual_shape)

    def call(self, text, visual, text_attention_mask=None, visual_attention_mask=None, training=None):
        text_attended = self.text_cross_attention(
            text, value=visual, attention_mask=visual_attention_mask, training=training
        )
        visual_attended = self.visual_cross_attention(
            visual, value=text, attention_mask=text_attention_mask, training=training
        )
        text = self.text_attention_norm(
            text + self.text_attention_output_dropout(text_attended, training=training)
        )
        visual = self.visual_attention_norm(
            visual + self.visual_attention_output_dropout(visual_attended, training=training)
        )
        text = self.text_output_norm(
            text + self.text_feed_forward_dropout(self.text_feed_forward(text), training=training)
        )
        visual = self.visual_output_norm(
            visual + self.visual_feed_forward_dropout(self.visual_feed_forward(visual), training=training)
        )
        return text, visual

    def compute_output_shape(self, text_shape, visual_shape):
        return tuple(text_shape), tuple(visual_shape)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "co_attention_dim": self.co_attention_dim,
                "text_intermediate_dim": self.text_intermediate_dim,
                "visual_intermediate_dim": self.visual_intermediate_dim,
                "text_activation": self.text_activation,
                "visual_activation": self.visual_activation,
                "text_dropout": self.text_dropout,
                "visual_dropout": self.visual_dropout,
                "text_attention_dropout": self.text_attention_dropout,
                "visual_attention_dropout": self.visual_attention_dropout,
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            }
        )
        return config
