"""The two branches of a Reformer layer (Kitaev et al., 2020, "Reformer:
The Efficient Transformer", §3), the `F` and `G` of its reversible residual
(`layers.ReversibleSequence`):

    Y1 = X1 + F(X2),   F(x) = Dropout(Attention(LayerNorm(x)) W_O)
    Y2 = X2 + G(Y1),   G(x) = Dropout(FFN(LayerNorm(x)))

`Attention` is LSH attention (shared query/key projection), local
attention, or any other mechanism of the zoo; the projections have no
biases. The feed-forward may run a chunk of positions at a time. As in
Hugging Face `transformers` (`ReformerAttention`, `ChunkReformerFeedForward`),
whose weights copy across unchanged.
"""

import keras
import numpy as np

from attention_zoo_keras.attention.lsh import DEFAULT_NUM_HASHES
from attention_zoo_keras.attention.lsh import lsh_rotations_shape
from attention_zoo_keras.layers.feed_forward import FeedForward
from attention_zoo_keras.layers.fused_keras_layers import LayerNormalization
from attention_zoo_keras.layers.initializers import clone_initializer
from attention_zoo_keras.layers.multi_head_attention import MultiHeadAttention
from attention_zoo_keras.registration import register


@register
class ReformerAttention(keras.layers.Layer):
    """The attention branch `F`: layer norm, self-attention, output
    projection, dropout.

    Args:
        num_heads: int. The attention heads.
        head_dim: int. The size of each head.
        attention: str. The mechanism, `"lsh"` (its queries and keys share
            one projection), `"local"`, or another registered name.
        attention_options: dict or None. The mechanism's options (see
            `MultiHeadAttention`).
        is_causal: bool. Causal self-attention (the Reformer language model).
        dropout: float. Dropout on the branch's output
            (`hidden_dropout_prob`).
        attention_dropout: float. Dropout on the attention probabilities.
        layer_norm_epsilon: float. The epsilon of the layer norm.
        kernel_initializer: str or `keras.initializers.Initializer`. The
            initializer of the projections.

    Attributes:
        rotations: tensor or None. `None`, or the fixed LSH rotations set by
            `set_rotations`, used at every call instead of drawing them.

    Call args:
        x: tensor of shape `(batch, length, hidden_dim)`. The input stream.
        attention_mask: bool tensor of shape `(batch, 1, length)` or None.
            The key padding.
        training: bool or None. Dropout on or off.
        cache: tensor or None. A decoding cache (see `MultiHeadAttention`);
            then the call returns `(output, cache)`.
        cache_update_index: int or int scalar tensor or None. The position
            of the first new token.

    Example:

    >>> import numpy as np
    >>> branch = ReformerAttention(num_heads=2, head_dim=4, attention="lsh",
    ...                            attention_options={"chunk_length": 4, "num_buckets": 2})
    >>> tuple(branch(np.random.rand(1, 8, 6).astype("float32")).shape)
    (1, 8, 6)
    """

    def __init__(
        self,
        num_heads,
        head_dim,
        attention="lsh",
        attention_options=None,
        is_causal=True,
        dropout=0.0,
        attention_dropout=0.0,
        layer_norm_epsilon=1e-12,
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.attention = attention
        self.attention_options = dict(attention_options or {})
        self.is_causal = is_causal
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.layer_norm_epsilon = layer_norm_epsilon
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.rotations = None
        self.norm = LayerNormalization(epsilon=layer_norm_epsilon, dtype=self.dtype_policy, name="norm")
        self.self_attention = MultiHeadAttention(
            num_heads=num_heads,
            head_dim=head_dim,
            attention=attention,
            attention_options=self.attention_options,
            dropout=attention_dropout,
            use_bias=False,
            kernel_initializer=clone_initializer(self.kernel_initializer),
            shared_query_key=attention == "lsh",
            dtype=self.dtype_policy,
            name="self_attention",
        )
        self.output_dropout = keras.layers.Dropout(dropout, dtype=self.dtype_policy, name="output_dropout")

    def build(self, input_shape):
        self.norm.build(input_shape)
        self.self_attention.build(input_shape)

    @property
    def rotations_shape(self):
        """The shape of this LSH branch's rotations, `(num_heads, head_dim,
        num_hashes, Σ b_f / 2)` (`attention.lsh_rotations_shape`, the
        layout of transformers' `LSHSelfAttention`).

        Raises:
            ValueError: for a branch that is not LSH attention, or without
                `num_buckets` (its default depends on the sequence length).
        """
        self._check_lsh("rotations_shape")
        num_buckets = self.attention_options.get("num_buckets")
        if num_buckets is None:
            raise ValueError(
                "The LSH rotations' shape depends on num_buckets, which is not set (it then follows the "
                "sequence length); give the branch attention_options={'num_buckets': ...}."
            )
        return lsh_rotations_shape(
            self.num_heads, self.head_dim, self.attention_options.get("num_hashes", DEFAULT_NUM_HASHES), num_buckets
        )

    def set_rotations(self, rotations):
        """Fixes the random rotations this LSH branch hashes with, at every
        call and while decoding, instead of drawing them (from the `seed`
        option, or afresh each call).

        This is how another implementation's hashing is reproduced: for
        transformers' Reformer with `hash_seed=s`, pass
        `torch.manual_seed(s); torch.randn(branch.rotations_shape)` (as a
        numpy array). The rotations are not saved with the model.

        Args:
            rotations: array of shape `(num_heads, head_dim, num_hashes,
                Σ b_f / 2)` (`rotations_shape`) or None. `None` draws them
                again.

        Raises:
            ValueError: for a branch that is not LSH attention, or rotations
                of another shape (naming both).
        """
        self._check_lsh("set_rotations")
        if rotations is None:
            self.rotations = None
            return
        rotations = np.asarray(keras.ops.convert_to_numpy(rotations), dtype="float32")
        num_buckets = self.attention_options.get("num_buckets")
        expected = (self.num_heads, self.head_dim, self.attention_options.get("num_hashes", DEFAULT_NUM_HASHES))
        shape_text = "(num_heads, head_dim, num_hashes, sum(num_buckets) // 2)"
        if num_buckets is not None:
            expected = self.rotations_shape
        if rotations.ndim != 4 or rotations.shape[: len(expected)] != expected:
            raise ValueError(
                f"LSH rotations for '{self.name}' must have shape {shape_text} = {expected}"
                f"{'' if num_buckets is not None else ' + (any,)'}; got {rotations.shape}."
            )
        self.rotations = rotations

    def _check_lsh(self, what):
        if self.attention != "lsh":
            raise ValueError(
                f"{what} is for LSH attention branches; '{self.name}' uses '{self.attention}' attention, "
                "which hashes nothing."
            )

    def call(self, x, attention_mask=None, training=None, cache=None, cache_update_index=None):
        arguments = None if self.rotations is None else {"rotations": self.rotations}
        attended = self.self_attention(
            self.norm(x),
            attention_mask=attention_mask,
            is_causal=self.is_causal,
            training=training,
            cache=cache,
            cache_update_index=cache_update_index,
            mechanism_arguments=arguments,
        )
        if cache is not None:
            attended, cache = attended
            return self.output_dropout(attended, training=training), cache
        return self.output_dropout(attended, training=training)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "head_dim": self.head_dim,
                "attention": self.attention,
                "attention_options": self.attention_options,
                "is_causal": self.is_causal,
                "dropout": self.dropout,
                "attention_dropout": self.attention_dropout,
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            }
        )
        return config


@register
class ReformerFeedForward(keras.layers.Layer):
    """The feed-forward branch `G`: layer norm, the position-wise
    feed-forward network (optionally a chunk of positions at a time),
    dropout.

    transformers also drops out between the first dense layer and the
    activation; that inner dropout is not reproduced (it only acts while
    training).

    Args:
        intermediate_dim: int. The width of the hidden layer
            (`feed_forward_size`).
        activation: str. The activation's name (`hidden_act`).
        dropout: float. Dropout on the branch's output.
        layer_norm_epsilon: float. The epsilon of the layer norm.
        chunk_size: int or None. Positions per chunk
            (`chunk_size_feed_forward`; `None` or 0: all at once).
        kernel_initializer: str or `keras.initializers.Initializer`. The
            initializer of both kernels.

    Example:

    >>> import numpy as np
    >>> tuple(ReformerFeedForward(16, chunk_size=4)(np.zeros((1, 10, 6), "float32")).shape)
    (1, 10, 6)
    """

    def __init__(
        self,
        intermediate_dim,
        activation="relu",
        dropout=0.0,
        layer_norm_epsilon=1e-12,
        chunk_size=None,
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.intermediate_dim = intermediate_dim
        self.activation = activation
        self.dropout = dropout
        self.layer_norm_epsilon = layer_norm_epsilon
        self.chunk_size = chunk_size or None
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.norm = LayerNormalization(epsilon=layer_norm_epsilon, dtype=self.dtype_policy, name="norm")
        self.feed_forward = FeedForward(
            intermediate_dim,
            activation=activation,
            kernel_initializer=clone_initializer(self.kernel_initializer),
            chunk_size=self.chunk_size,
            dtype=self.dtype_policy,
            name="feed_forward",
        )
        self.output_dropout = keras.layers.Dropout(dropout, dtype=self.dtype_policy, name="output_dropout")

    def build(self, input_shape):
        self.norm.build(input_shape)
        self.feed_forward.build(input_shape)

    def call(self, x, training=None):
        return self.output_dropout(self.feed_forward(self.norm(x)), training=training)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "intermediate_dim": self.intermediate_dim,
                "activation": self.activation,
                "dropout": self.dropout,
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "chunk_size": self.chunk_size,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            }
        )
        return config
