"""GPT-2 (Radford et al., 2019, "Language Models are Unsupervised Multitask
Learners"): a decoder-only, pre-norm Transformer.

    H_0 = Dropout(TokenEmb(x) + PositionEmb(t))
    H_l = H_{l-1} + Attn(LN(H_{l-1}));  H_l += FFN(LN(H_l)),   l = 1..L (causal)
    out = LN_f(H_L)
"""

import keras
from keras import ops

from attention_zoo_keras.layers.block_stack import block_stack
from attention_zoo_keras.layers.embedding import Embedding
from attention_zoo_keras.layers.fused_keras_layers import LayerNormalization
from attention_zoo_keras.layers.initializers import clone_initializer
from attention_zoo_keras.layers.position_embedding import PositionEmbedding
from attention_zoo_keras.layers.transformer_encoder_block import TransformerEncoderBlock
from attention_zoo_keras.models.backbone import Backbone
from attention_zoo_keras.models.input_validation import check_token_inputs
from attention_zoo_keras.registration import register


@register
class GPTBackbone(Backbone):
    """The GPT-2 decoder: token and learned position embeddings, pre-norm
    causal Transformer blocks and a final layer norm.

    Args:
        vocabulary_size: int. The number of token ids.
        num_layers: int. The number of decoder blocks.
        num_heads: int. The attention heads per block.
        hidden_dim: int. The width of the hidden states.
        intermediate_dim: int. The feed-forward width (GPT-2:
            `4 * hidden_dim`).
        dropout: float. Dropout on embeddings and residual branches.
        attention_dropout: float. Dropout on attention probabilities; must
            be 0 for `attention="linear"`, which has none.
        max_sequence_length: int. The number of learned positions.
        activation: str. The feed-forward activation; `"gelu_new"` is GPT-2's
            tanh GELU.
        layer_norm_epsilon: float. The epsilon of every layer norm.
        attention: str. The attention mechanism's name, `"softmax"` for GPT-2;
            `"linear"` gives a linear-attention Transformer (Katharopoulos
            et al., 2020) that generates with a constant-size recurrent state;
            `"relative"` with `attention_options={"max_distance":
            max_sequence_length - 1, "per_head": True, "value_embeddings":
            False}` a Music-Transformer-style LM. Any causal mechanism with
            a decoding cache (see `attention.registry.get_decoding`) can
            generate.
        attention_options: dict or None. The mechanism's options (see
            `MultiHeadAttention`).
        initializer_range: float. The standard deviation of the
            truncated-normal init.
        dtype: str, `keras.DTypePolicy` or None. The dtype policy of every
            layer, e.g. `"bfloat16"`.

    Inputs: a dict of `token_ids` and `padding_mask`, each `(batch, length)`
    int. Output: a dict with one entry, `sequence_output`
    `(batch, length, hidden_dim)` (a dict, like every backbone here, so
    entries can be added later without breaking callers).

    Example:

    >>> import numpy as np
    >>> backbone = GPTBackbone(vocabulary_size=100, num_layers=2, num_heads=2,
    ...                        hidden_dim=16, intermediate_dim=32, max_sequence_length=8)
    >>> ids = np.array([[15, 27, 3, 0]])
    >>> out = backbone({"token_ids": ids, "padding_mask": np.array([[1, 1, 1, 0]])})
    >>> tuple(out["sequence_output"].shape)
    (1, 4, 16)
    """

    family = "gpt"

    def __init__(
        self,
        vocabulary_size,
        num_layers,
        num_heads,
        hidden_dim,
        intermediate_dim,
        dropout=0.1,
        attention_dropout=0.1,
        max_sequence_length=1024,
        activation="gelu_new",
        layer_norm_epsilon=1e-5,
        attention="softmax",
        attention_options=None,
        initializer_range=0.02,
        dtype=None,
        **kwargs,
    ):
        if attention == "linear" and attention_dropout > 0.0:
            raise ValueError(
                f"GPTBackbone(attention='linear') needs attention_dropout=0.0; got {attention_dropout}. "
                "Linear attention has no attention probabilities to drop out (Katharopoulos et al., "
                "2020, use no attention dropout); residual and embedding dropout (`dropout`) are unaffected."
            )

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
        embeddings_dropout = keras.layers.Dropout(dropout, dtype=dtype, name="embeddings_dropout")
        blocks = block_stack(
            TransformerEncoderBlock, num_layers, initializer, num_heads=num_heads, intermediate_dim=intermediate_dim,
            activation=activation, dropout=dropout, attention_dropout=attention_dropout, norm_first=True, is_causal=True,
            layer_norm_epsilon=layer_norm_epsilon, attention=attention, attention_options=attention_options, dtype=dtype,
        )
        final_norm = LayerNormalization(epsilon=layer_norm_epsilon, dtype=dtype, name="final_norm")

        # === Functional Model ===
        token_ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
        padding_mask = keras.Input(shape=(None,), dtype="int32", name="padding_mask")

        x = embeddings_dropout(token_embedding(token_ids) + position_embedding(token_ids))
        attention_mask = ops.expand_dims(ops.cast(padding_mask, "bool"), axis=1)
        for block in blocks:
            x = block(x, attention_mask=attention_mask)
        x = final_norm(x)

        super().__init__(
            inputs={"token_ids": token_ids, "padding_mask": padding_mask},
            outputs={"sequence_output": x},
            dtype=dtype,
            **kwargs,
        )
        self.token_embedding = token_embedding
        self.position_embedding = position_embedding
        self.transformer_layers = blocks
        self.final_norm = final_norm

        # === Config ===
        self.vocabulary_size = vocabulary_size
        self.num_layers = num_layers
        self.num_heads = num_heads
        self.hidden_dim = hidden_dim
        self.intermediate_dim = intermediate_dim
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.max_sequence_length = max_sequence_length
        self.activation = activation
        self.layer_norm_epsilon = layer_norm_epsilon
        self.attention = attention
        self.attention_options = dict(attention_options or {})
        self.initializer_range = initializer_range

    def validate_inputs(self, inputs):
        check_token_inputs(inputs, self.vocabulary_size, self.max_sequence_length)

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
                "activation": self.activation,
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "attention": self.attention,
                "attention_options": self.attention_options,
                "initializer_range": self.initializer_range,
            }
        )
        return config
