"""Keras' `Dense` and `LayerNormalization`, computed by one fused kernel
each where the backend has one (`backend_support.dense_kernels`).

Same weights, names (`dense`, `layer_normalization`), configs, LoRA and
quantization as Keras' layers, which they subclass: only `call` differs,
and only where the fused kernel computes the same function (a plain dense
layer; a normalization over the last axis with a scale and an offset).

Example:

>>> layer = Dense(4)
>>> tuple(layer(keras.ops.ones((2, 3))).shape)
(2, 4)
"""

import keras

from attention_zoo_keras.backend_support import dense_projection
from attention_zoo_keras.backend_support import layer_normalization
from attention_zoo_keras.registration import register


@register
class Dense(keras.layers.Dense):
    """`keras.layers.Dense` whose bias add is part of the matrix product
    (torch: `linear`)."""

    def call(self, inputs, training=None):
        outputs = dense_projection(inputs, self.kernel, self.bias)
        if outputs is None:
            return super().call(inputs, training=training)
        return outputs if self.activation is None else self.activation(outputs)

    def quantize(self, mode=None, type_check=True, config=None):
        """Keras' `Dense.quantize`, which refuses subclasses (their `call`
        might compute something else); a quantized layer runs Keras'
        `quantized_call`, not the `call` above."""
        return super().quantize(mode, type_check=False, config=config)


@register
class LayerNormalization(keras.layers.LayerNormalization):
    """`keras.layers.LayerNormalization` computed in the input's dtype by the
    backend's kernel (torch: `layer_norm`, which accumulates in float32)."""

    def call(self, inputs):
        plain = self.axis in (-1, [-1], len(inputs.shape) - 1, [len(inputs.shape) - 1])
        if plain and self.center and self.scale and not self.rms_scaling:
            outputs = layer_normalization(inputs, self.gamma, self.beta, self.epsilon)
            if outputs is not None:
                return keras.ops.cast(outputs, self.compute_dtype)
        return super().call(inputs)
