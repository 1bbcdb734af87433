"""Position-wise feed-forward network (Vaswani et al., 2017, §3.3):

    FFN(x) = act(x W₁ + b₁) W₂ + b₂
"""

import keras

from attention_zoo_keras.layers.initializers import clone_initializer
from attention_zoo_keras.layers.activations import get_activation
from attention_zoo_keras.registration import register


@register
class FeedForward(keras.layers.Layer):
    """Two dense layers with an activation between them.

    Args:
        intermediate_dim: width of the hidden layer.
        activation: activation name (see `layers.activations`), e.g. `"gelu"`.
        output_dim: output width; defaults to the input's width.
        kernel_initializer: initializer of both kernels.

    Example:

    >>> import numpy as np
    >>> tuple(FeedForward(16)(np.zeros((1, 3, 8), "float32")).shape)
    (1, 3, 8)
    """

    def __init__(
        self,
        intermediate_dim,
        activation="gelu",
        output_dim=None,
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.intermediate_dim = intermediate_dim
        self.activation = activation
        self.output_dim = output_dim
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self._activation_fn = get_activation(activation)
        self.intermediate_dense = keras.layers.Dense(
            intermediate_dim,
            kernel_initializer=clone_initializer(kernel_initializer),
            dtype=self.dtype_policy,
            name="intermediate",
        )
        self.output_dense = None

    def build(self, input_shape):
        self.intermediate_dense.build(input_shape)
        self.output_dense = keras.layers.Dense(
            self.output_dim or input_shape[-1],
            kernel_initializer=clone_initializer(self.kernel_initializer),
            dtype=self.dtype_policy,
            name="output",
        )
        self.output_dense.build(tuple(input_shape[:-1]) + (self.intermediate_dim,))

    def call(self, x):
        return self.output_dense(self._activation_fn(self.intermediate_dense(x)))

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (self.output_dim or input_shape[-1],)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "intermediate_dim": self.intermediate_dim,
                "activation": self.activation,
                "output_dim": self.output_dim,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            }
        )
        return config
