"""A classification head over pooled features (Devlin et al., 2019, §4.1;
Dosovitskiy et al., 2021, §3.1; Lu et al., 2019, §3.2):

    logits = W Dropout(h) + b
    logits = W_2 LayerNorm(act(W_1 Dropout(h) + b_1)) + b_2     with a hidden layer

`h` is a pooled vector `(batch, dim)` or one vector per position
`(batch, positions, dim)`; the dense layers act on the last axis.
"""

import keras

from attention_zoo_keras.layers.fused_keras_layers import Dense
from attention_zoo_keras.layers.fused_keras_layers import LayerNormalization
from attention_zoo_keras.layers.initializers import clone_initializer


def classification_head(
    inputs,
    num_outputs,
    dropout,
    kernel_initializer,
    dtype=None,
    name="classifier",
    output_name=None,
    hidden_dim=None,
    hidden_activation="gelu",
    layer_norm_epsilon=1e-12,
):
    """Logits from pooled features, as new layers in a functional graph.

    The layers are `{name}_dropout`, with `hidden_dim` also `{name}_hidden`
    and `{name}_hidden_norm`, and the output layer `output_name`.

    Args:
        inputs: KerasTensor. The features, `(batch, ..., dim)`.
        num_outputs: int. The number of logits per input vector.
        dropout: float. Dropout rate on the features.
        kernel_initializer: str, dict or `keras.initializers.Initializer`.
            The kernels' initializer; each dense layer gets its own copy.
        dtype: str or `keras.DTypePolicy`. The layers' dtype policy.
        name: str. Prefix of the layers' names.
        output_name: str. Name of the output layer; defaults to `name`.
        hidden_dim: int. Width of a hidden layer before the output layer;
            `None` for none.
        hidden_activation: str. Activation of the hidden layer.
        layer_norm_epsilon: float. Epsilon of the hidden layer's norm.

    Returns:
        KerasTensor. The logits, `(batch, ..., num_outputs)`.

    Example:

    >>> import keras
    >>> pooled = keras.Input((16,))
    >>> logits = classification_head(pooled, 3, dropout=0.1, kernel_initializer="glorot_uniform")
    >>> [layer.name for layer in keras.Model(pooled, logits).layers[1:]], tuple(logits.shape)
    (['classifier_dropout', 'classifier'], (None, 3))
    """
    x = keras.layers.Dropout(dropout, dtype=dtype, name=f"{name}_dropout")(inputs)
    if hidden_dim is not None:
        x = Dense(
            hidden_dim, activation=hidden_activation, kernel_initializer=clone_initializer(kernel_initializer),
            dtype=dtype, name=f"{name}_hidden",
        )(x)
        x = LayerNormalization(epsilon=layer_norm_epsilon, dtype=dtype, name=f"{name}_hidden_norm")(x)
    return Dense(
        num_outputs, kernel_initializer=clone_initializer(kernel_initializer), dtype=dtype,
        name=output_name or name,
    )(x)
