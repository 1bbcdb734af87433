"""The Transformer-XL decoder block (Dai et al., 2019, §3.3): relative
attention over the memory and the segment, then a feed-forward network.

Post-norm (the paper's models):

    h = LayerNorm(x + Dropout(RelAttn(x, [m; x])))
    y = LayerNorm(h + Dropout(FFN(h)))

Pre-norm (the authors' `pre_lnorm`; the memory is normalised with the
segment, since it holds the block's un-normalised inputs):

    h = x + Dropout(RelAttn(LN(x), [LN(m); LN(x)]))
    y = h + Dropout(FFN(LN(h)))

`RelAttn` is the `xl` mechanism (`attention.xl`) behind bias-free query, key,
value and output projections; this block also owns `W_R`, the projection
of the sinusoidal distance encodings to per-head position keys.
"""

from keras import ops

from attention_zoo_keras.layers.fused_keras_layers import Dense
from attention_zoo_keras.layers.initializers import clone_initializer
from attention_zoo_keras.layers.transformer_encoder_block import TransformerEncoderBlock
from attention_zoo_keras.registration import register


@register
class TransformerXLBlock(TransformerEncoderBlock):
    """Relative self-attention with memory and a feed-forward network.

    Args:
        num_heads: int. The attention heads.
        intermediate_dim: int. The feed-forward width.
        activation: str. The feed-forward activation (ReLU by default).
        per_layer_biases: bool. Whether this block has its own content and
            position biases u, v (`untie_r`); otherwise the caller passes
            shared ones.
        **kwargs: The other arguments of `TransformerEncoderBlock`
            (attention is always causal Transformer-XL attention).

    Call args:
        x: tensor of shape `(batch, length, hidden_dim)`. The segment.
        position_encodings: tensor of shape `(distances, hidden_dim)`. The
            sinusoidal encodings of distances `0, 1, …` (clamped), one row
            per key without a cache.
        memory: tensor of shape `(batch, memory_length, hidden_dim)` or None.
            The previous segment's inputs to this block (may be empty);
            `None` with a cache.
        attention_mask: bool tensor of shape `(1 or batch, length, keys)` or
            None. E.g. the `same_length` window
            (`attention.xl.xl_attention_mask`).
        shared_biases: tuple of two tensors or None. `(content_bias,
            position_bias)` when the biases are shared, each
            `(num_heads, head_dim)`.
        training: bool or None. Dropout on or off.
        cache: tensor or None. A key/value cache for decoding (see
            `MultiHeadAttention`); the block then returns `(y, new_cache)`.
        cache_update_index: int or int scalar tensor or None. The position
            of the first new token in `cache`.
        position_keys: tensor of shape `(distances, num_heads, head_dim)` or
            None. `position_keys(position_encodings)`, computed once by the
            caller; `None` computes it here.

    Example:

    >>> import numpy as np
    >>> block = TransformerXLBlock(num_heads=2, intermediate_dim=16, head_dim=4)
    >>> x, memory = np.zeros((1, 3, 8), "float32"), np.zeros((1, 2, 8), "float32")
    >>> tuple(block(x, position_encodings=np.zeros((5, 8), "float32"), memory=memory).shape)
    (1, 3, 8)
    """

    def __init__(self, num_heads, intermediate_dim, activation="relu", per_layer_biases=True, **kwargs):
        kwargs.pop("attention", None)
        kwargs.pop("attention_options", None)
        kwargs.pop("is_causal", None)
        super().__init__(
            num_heads, intermediate_dim, activation=activation, is_causal=True, attention="xl",
            attention_options={"per_layer_biases": per_layer_biases}, **kwargs,
        )
        self.per_layer_biases = per_layer_biases
        self.position_projection = None

    def build(self, x_shape):
        hidden_dim = x_shape[-1]
        self.self_attention = self._attention_layer(
            hidden_dim, "self_attention", self.attention, self.attention_options, use_bias=False
        )
        self.self_attention.build(x_shape)
        self.position_projection = Dense(
            self.num_heads * self.self_attention.head_dim,
            use_bias=False,
            kernel_initializer=clone_initializer(self.kernel_initializer),
            dtype=self.dtype_policy,
            name="position_projection",
        )
        self.position_projection.build((None, hidden_dim))
        self.attention_norm.build(x_shape)
        self.feed_forward.build(x_shape)
        self.output_norm.build(x_shape)

    def position_keys(self, position_encodings):
        """`W_R R`: `(distances, num_heads, head_dim)`."""
        projected = self.position_projection(position_encodings)
        heads = self.self_attention
        return ops.reshape(projected, (ops.shape(projected)[0], heads.num_heads, heads.head_dim))

    def call(
        self,
        x,
        position_encodings=None,
        memory=None,
        attention_mask=None,
        shared_biases=None,
        training=None,
        cache=None,
        cache_update_index=None,
        position_keys=None,
    ):
        if position_keys is None:
            position_keys = self.position_keys(position_encodings)
        arguments = {"position_keys": position_keys}
        if shared_biases is not None:
            arguments["content_bias"], arguments["position_bias"] = shared_biases
        new_cache = []

        def attend(h):
            if cache is not None:
                attended, updated = self.self_attention(
                    h, attention_mask=attention_mask, is_causal=True, training=training, cache=cache,
                    cache_update_index=cache_update_index, mechanism_arguments=arguments,
                )
                new_cache.append(updated)
            else:
                context = memory
                if self.norm_first:
                    context = self.attention_norm(memory)
                attended = self.self_attention(
                    h, value=ops.concatenate([ops.cast(context, h.dtype), h], axis=1),
                    attention_mask=attention_mask, is_causal=True, training=training,
                    mechanism_arguments=arguments,
                )
            return self.attention_output_dropout(attended, training=training)

        h = self._residual(x, self.attention_norm, attend)
        y = self._feed_forward_sublayer(h, training)
        if cache is not None:
            return y, new_cache[0]
        return y

    def get_config(self):
        config = super().get_config()
        for key in ("attention", "attention_options", "is_causal"):
            config.pop(key)
        config["per_layer_biases"] = self.per_layer_biases
        return config
