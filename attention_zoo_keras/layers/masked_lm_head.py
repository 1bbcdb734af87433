"""The masked-language-model head of BERT (Devlin et al., 2019, §3.1, Task 1):

    h = LayerNorm(act(W_t x + b_t))
    logits = h Eᵀ + b

with `E` the token embedding matrix (weights tied with the input embedding;
dequantized when it is quantized, see `embedding_matrix`),
evaluated only at the selected `mask_positions`.
"""

import keras
from keras import ops

from attention_zoo_keras.layers.activations import get_activation
from attention_zoo_keras.layers.embedding_matrix import embedding_matrix
from attention_zoo_keras.layers.fused_keras_layers import Dense
from attention_zoo_keras.layers.fused_keras_layers import LayerNormalization
from attention_zoo_keras.layers.initializers import clone_initializer


class MaskedLMHead(keras.layers.Layer):
    """Vocabulary logits at chosen positions, sharing the input embeddings.

    Args:
        token_embedding: keras.layers.Embedding. The backbone's token
            embedding, whose matrix is reused (transposed) as the output
            projection.
        activation: str. The activation of the transform, e.g. `"gelu"`.
        layer_norm_epsilon: float. The epsilon of the transform's layer
            norm.
        kernel_initializer: str or keras.initializers.Initializer. The
            initializer of the transform.

    Call args:
        sequence_output: tensor of shape `(batch, length, hidden_dim)`. The
            backbone's output.
        mask_positions: int tensor of shape `(batch, num_predictions)`. The
            positions to predict.

    Returns:
        `(batch, num_predictions, vocabulary_size)` logits.
    """

    def __init__(self, token_embedding, activation="gelu", layer_norm_epsilon=1e-12, kernel_initializer="glorot_uniform", **kwargs):
        super().__init__(**kwargs)
        self.token_embedding = token_embedding
        self.activation = activation
        self.layer_norm_epsilon = layer_norm_epsilon
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self._activation_fn = get_activation(activation)
        self.transform = None
        self.transform_norm = LayerNormalization(
            epsilon=layer_norm_epsilon, dtype=self.dtype_policy, name="transform_norm"
        )

    def build(self, sequence_output_shape, mask_positions_shape=None):
        hidden_dim = sequence_output_shape[-1]
        self.transform = Dense(
            hidden_dim, kernel_initializer=clone_initializer(self.kernel_initializer),
            dtype=self.dtype_policy, name="transform",
        )
        self.transform.build((None, None, hidden_dim))
        self.transform_norm.build((None, None, hidden_dim))
        self.output_bias = self.add_weight(
            name="output_bias", shape=(self.token_embedding.input_dim,), initializer="zeros"
        )

    def call(self, sequence_output, mask_positions):
        selected = ops.take_along_axis(sequence_output, ops.expand_dims(mask_positions, -1), axis=1)
        hidden = self.transform_norm(self._activation_fn(self.transform(selected)))
        embeddings = embedding_matrix(self.token_embedding, hidden.dtype)
        return ops.matmul(hidden, ops.transpose(embeddings)) + ops.cast(self.output_bias, hidden.dtype)

    def compute_output_shape(self, sequence_output_shape, mask_positions_shape):
        return tuple(mask_positions_shape) + (self.token_embedding.input_dim,)
