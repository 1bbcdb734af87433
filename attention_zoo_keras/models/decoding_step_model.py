"""One decoding step of a causal language model as a Keras model of its
own, so that Keras' exporters (`model.export`: a SavedModel, ONNX, LiteRT)
write it and a serving runtime runs generation with it:

    (logits_t, cache_{≤t}) = step(token_t, cache_{<t}, t)

`logits_t` `(batch, vocabulary)` scores the token after position `t`, and
the cache (every layer's keys and values, or a recurrent state) comes back
extended by position `t`. The runtime feeds the prompt one token at a time,
then its choice of each next token, carrying the cache from call to call.
The cache's tensors are named `cache_0 … cache_{n−1}` in the order of
`keras.tree.flatten` of the model's own cache (`init_cache`), so one exported
signature serves every mechanism that decodes token by token.
"""

import keras
from keras import ops

from attention_zoo_keras.models.serving_export import ServingExport


class DecodingStepModel(ServingExport, keras.Model):
    """`lm`'s decoding step for `batch_size` rows and `max_length`
    positions: inputs `token_ids` `(batch_size, 1)` int32, `index` `(1,)`
    int32 (the position of those tokens) and the cache's tensors
    `cache_0 …`; outputs `logits` `(batch_size, vocabulary)` and the
    extended cache under the same names.

    Made by `CausalLM.decoding_step_model`; it shares `lm`'s weights.

    Args:
        lm: CausalLM. The model whose step this is.
        batch_size: int. The rows decoded together.
        max_length: int. The positions the cache holds (at most the model's
            limit).
    """

    def __init__(self, lm, batch_size, max_length, **kwargs):
        super().__init__(**kwargs)
        self.lm = lm
        self.batch_size = int(batch_size)
        self.max_length = int(max_length)
        cache = lm.init_cache(self.batch_size, self.max_length)
        self._cache_structure = keras.tree.map_structure(lambda tensor: None, cache)
        self._cache_specs = [
            keras.InputSpec(shape=tuple(ops.shape(tensor)), dtype=keras.backend.standardize_dtype(tensor.dtype))
            for tensor in keras.tree.flatten(cache)
        ]
        self.built = True  # (its weights are `lm`'s, built already)

    def call(self, inputs):
        flat_cache = [inputs[f"cache_{i}"] for i in range(len(self._cache_specs))]
        cache = keras.tree.pack_sequence_as(self._cache_structure, flat_cache)
        index = ops.reshape(ops.cast(inputs["index"], "int32"), ())
        constants = self.lm._decoding_constants(self.max_length)
        logits, cache = self.lm._next_token_logits(ops.cast(inputs["token_ids"], "int32"), cache, index, *constants)
        outputs = {"logits": ops.cast(logits, "float32")}
        outputs.update({f"cache_{i}": tensor for i, tensor in enumerate(keras.tree.flatten(cache))})
        return outputs

    def input_signature(self):
        """The inputs' `keras.InputSpec`s, as `export(input_signature=...)`
        takes them."""
        specs = {
            "token_ids": keras.InputSpec(shape=(self.batch_size, 1), dtype="int32"),
            "index": keras.InputSpec(shape=(1,), dtype="int32"),
        }
        specs.update({f"cache_{i}": spec for i, spec in enumerate(self._cache_specs)})
        return [specs]

    def empty_cache(self):
        """`{name: numpy array}`: the cache before the first token."""
        cache = keras.tree.flatten(self.lm.init_cache(self.batch_size, self.max_length))
        return {f"cache_{i}": ops.convert_to_numpy(tensor) for i, tensor in enumerate(cache)}

    def export(self, filepath, format="tf_saved_model", verbose=None, input_signature=None, **kwargs):
        """Keras' `Model.export` with this step's own input signature (see
        `ServingExport.export` for the formats).

        Example:

        >>> step = lm.decoding_step_model(batch_size=1, max_length=64)  # doctest: +SKIP
        >>> step.export("gpt2_step.tflite", format="litert")            # doctest: +SKIP
        """
        return super().export(
            filepath, format=format, verbose=verbose, input_signature=input_signature or self.input_signature(),
            **kwargs,
        )
