"""BERT (Devlin et al., 2019, "BERT: Pre-training of Deep Bidirectional
Transformers for Language Understanding").

    E = LayerNorm(TokenEmb(x) + PositionEmb(t) + SegmentEmb(s))
    H_l = PostNormEncoderBlock(H_{l-1}),  l = 1..L
    pooled = tanh(W_p H_L[CLS] + b_p)

Under JAX the blocks see each row's padding moved after its tokens and
attend by key lengths (`layers.padding_last`; the same outputs, in the
inputs' order).
"""

import keras
from keras import ops

from attention_zoo_keras import backend_support
from attention_zoo_keras.layers.block_stack import block_stack
from attention_zoo_keras.layers.embedding import Embedding
from attention_zoo_keras.layers.fused_keras_layers import Dense
from attention_zoo_keras.layers.fused_keras_layers import LayerNormalization
from attention_zoo_keras.layers.initializers import clone_initializer
from attention_zoo_keras.layers.padding_last import PermutePositions
from attention_zoo_keras.layers.padding_last import padding_last_order
from attention_zoo_keras.layers.position_embedding import PositionEmbedding
from attention_zoo_keras.layers.transformer_encoder_block import TransformerEncoderBlock
from attention_zoo_keras.models.backbone import Backbone
from attention_zoo_keras.models.input_validation import check_token_inputs
from attention_zoo_keras.registration import register


@register
class BertBackbone(Backbone):
    """The BERT encoder: embeddings, post-norm Transformer blocks, pooler.

    Args:
        vocabulary_size: int. The number of token ids.
        num_layers: int. The number of encoder blocks.
        num_heads: int. The attention heads per block.
        hidden_dim: int. The width of the hidden states.
        intermediate_dim: int. The feed-forward width.
        dropout: float. Dropout on embeddings and residual branches.
        attention_dropout: float. Dropout on attention probabilities.
        max_sequence_length: int. The number of learned positions.
        num_segments: int. The number of segment (token type) ids.
        activation: str. The feed-forward activation (`"gelu"` is BERT's
            exact GELU).
        layer_norm_epsilon: float. The epsilon of every layer norm.
        attention: str. The attention mechanism's name, `"softmax"` for
            BERT; any mechanism of `attention.mechanism_names()` works in the
            encoder.
        attention_options: dict or None. The mechanism's options, e.g.
            `{"block_size": 64}` for `"local"` (see `MultiHeadAttention`).
        initializer_range: float. The standard deviation of the
            truncated-normal init.
        dtype: str, `keras.DTypePolicy` or None. The dtype policy of every
            layer, e.g. `"bfloat16"`.

    Inputs: a dict of `token_ids`, `segment_ids` and `padding_mask`, each
    `(batch, length)` int. Outputs: a dict of `sequence_output`
    `(batch, length, hidden_dim)` and `pooled_output` `(batch, hidden_dim)`.

    Example:

    >>> import numpy as np
    >>> backbone = BertBackbone(vocabulary_size=100, num_layers=2, num_heads=2,
    ...                         hidden_dim=16, intermediate_dim=32, max_sequence_length=8)
    >>> ids = np.array([[2, 15, 27, 3, 0]])
    >>> out = backbone({"token_ids": ids, "segment_ids": np.zeros_like(ids),
    ...                 "padding_mask": (ids > 0).astype("int32")})
    >>> tuple(out["sequence_output"].shape), tuple(out["pooled_output"].shape)
    ((1, 5, 16), (1, 16))
    """

    family = "bert"

    def __init__(
        self,
        vocabulary_size,
        num_layers,
        num_heads,
        hidden_dim,
        intermediate_dim,
        dropout=0.1,
        attention_dropout=0.1,
        max_sequence_length=512,
        num_segments=2,
        activation="gelu",
        layer_norm_epsilon=1e-12,
        attention="softmax",
        attention_options=None,
        initializer_range=0.02,
        dtype=None,
        **kwargs,
    ):
        # === Layers ===
        initializer = keras.initializers.TruncatedNormal(stddev=initializer_range)
        token_embedding = Embedding(
            vocabulary_size, hidden_dim, embeddings_initializer=clone_initializer(initializer),
            dtype=dtype, name="token_embedding",
        )
        position_embedding = PositionEmbedding(
            max_sequence_length, hidden_dim, initializer=clone_initializer(initializer),
            dtype=dtype, name="position_embedding",
        )
        segment_embedding = Embedding(
            num_segments, hidden_dim, embeddings_initializer=clone_initializer(initializer),
            dtype=dtype, name="segment_embedding",
        )
        embeddings_norm = LayerNormalization(
            epsilon=layer_norm_epsilon, dtype=dtype, name="embeddings_norm"
        )
        embeddings_dropout = keras.layers.Dropout(dropout, dtype=dtype, name="embeddings_dropout")
        blocks = block_stack(
            TransformerEncoderBlock, num_layers, initializer, num_heads=num_heads, intermediate_dim=intermediate_dim,
            activation=activation, dropout=dropout, attention_dropout=attention_dropout, norm_first=False,
            layer_norm_epsilon=layer_norm_epsilon, attention=attention, attention_options=attention_options, dtype=dtype,
        )
        pooler = Dense(
            hidden_dim, activation="tanh", kernel_initializer=clone_initializer(initializer),
            dtype=dtype, name="pooler",
        )

        # === Functional Model ===
        token_ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
        segment_ids = keras.Input(shape=(None,), dtype="int32", name="segment_ids")
        padding_mask = keras.Input(shape=(None,), dtype="int32", name="padding_mask")

        x = token_embedding(token_ids) + position_embedding(token_ids) + segment_embedding(segment_ids)
        x = embeddings_dropout(embeddings_norm(x))
        moves_padding_last = attention == "softmax" and backend_support.encoders_move_padding_last()
        if moves_padding_last:
            order, destination, key_lengths = padding_last_order(padding_mask)
            x = PermutePositions(dtype=dtype, name="padding_last")(x, order, destination)
            padding = {"key_lengths": key_lengths}
        else:
            padding = {"attention_mask": ops.expand_dims(ops.cast(padding_mask, "bool"), axis=1)}
        for block in blocks:
            x = block(x, **padding)
        if moves_padding_last:
            x = PermutePositions(dtype=dtype, name="input_order")(x, destination, order)
        pooled = pooler(x[:, 0, :])

        super().__init__(
            inputs={"token_ids": token_ids, "segment_ids": segment_ids, "padding_mask": padding_mask},
            outputs={"sequence_output": x, "pooled_output": pooled},
            dtype=dtype,
            **kwargs,
        )
        self.token_embedding = token_embedding

        # === Config ===
        self.vocabulary_size = vocabulary_size
        self.num_layers = num_layers
        self.num_heads = num_heads
        self.hidden_dim = hidden_dim
        self.intermediate_dim = intermediate_dim
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.max_sequence_length = max_sequence_length
        self.num_segments = num_segments
        self.activation = activation
        self.layer_norm_epsilon = layer_norm_epsilon
        self.attention = attention
        self.attention_options = dict(attention_options or {})
        self.initializer_range = initializer_range

    def validate_inputs(self, inputs):
        check_token_inputs(inputs, self.vocabulary_size, self.max_sequence_length, num_segments=self.num_segments)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "vocabulary_size": self.vocabulary_size,
                "num_layers": self.num_layers,
                "num_heads": self.num_heads,
                "hidden_dim": self.hidden_dim,
                "intermediate_dim": self.intermediate_dim,
                "dropout": self.dropout,
                "attention_dropout": self.attention_dropout,
                "max_sequence_length": self.max_sequence_length,
                "num_segments": self.num_segments,
                "activation": self.activation,
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "attention": self.attention,
                "attention_options": self.attention_options,
                "initializer_range": self.initializer_range,
            }
        )
        return config
