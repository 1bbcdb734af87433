"""Keras' `Embedding`, whose table is read in its own dtype under mixed
precision, as Keras means it to be.

Keras' `Embedding` asks not to be autocast (`autocast = False`): the lookup
gathers rows of the float32 table and casts them to the compute dtype, so
the gradient of the table, a sum over every position holding a token, is
added up in float32. `Layer.__call__` honours that only inside an outer
autocast scope; from a model's `stateless_call` (Keras' training steps) a
mixed-precision `Embedding` casts its whole table to bfloat16 first, and
the gradient rows are summed in bfloat16: the padding token's row and a
frequent token's collect thousands of terms each batch, with 8 bits of
mantissa. On a GPU that sum is a bfloat16 scatter-add, which XLA compiles
to a compare-and-swap loop that stalls when many positions share a row
(openxla/xla#26371): 10 of the 21 ms of kernel time of a BERT-base train
step on an H200 (`docs/benchmarks.md`). Here the lookup reads the table in
its own dtype (`backend_support.variables_in_their_own_dtype`).

Same weights, names, configs, LoRA and quantization as Keras' layer, which
it subclasses.

Example:

>>> layer = Embedding(10, 4, dtype="mixed_bfloat16")
>>> layer(keras.ops.convert_to_tensor([[1, 2]])).dtype == keras.ops.convert_to_tensor(0, "bfloat16").dtype
True
"""

import keras

from attention_zoo_keras.backend_support import variables_in_their_own_dtype
from attention_zoo_keras.registration import register


@register
class Embedding(keras.layers.Embedding):
    """`keras.layers.Embedding` that gathers from its table in the table's
    own dtype, then casts the rows to the compute dtype."""

    def call(self, inputs):
        with variables_in_their_own_dtype():
            return super().call(inputs)

    def quantize(self, mode=None, type_check=True, config=None):
        """Keras' `Embedding.quantize`, which refuses subclasses; a
        quantized layer runs Keras' `quantized_call`, not the `call` above."""
        return super().quantize(mode, type_check=False, config=config)
