"""Checks of concrete model inputs, made before they reach a compiled graph.

Gathers on JAX silently clamp out-of-range indices (and TensorFlow fails deep
inside the graph), so token ids, segment ids, positions and lengths are
checked on concrete values in numpy, where the error can name the input.
"""

import keras
import numpy as np

from attention_zoo_keras import backend_support


def check_id_range(name, ids, upper):
    """Raises if any value in `ids` is negative or ≥ `upper`."""
    ids = np.asarray(ids) if isinstance(ids, (list, tuple, np.ndarray)) else keras.ops.convert_to_numpy(ids)
    if ids.size == 0:
        return
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= upper:
        bad = high if high >= upper else low
        raise ValueError(f"'{name}' holds the id {bad}, outside the valid range [0, {upper}).")


def check_sequence_length(name, ids, max_sequence_length):
    """Raises if `ids` is longer than the model's maximum sequence length."""
    length = np.shape(ids)[-1]
    if length is not None and length > max_sequence_length:
        raise ValueError(
            f"'{name}' has length {length}, longer than the model's maximum sequence length "
            f"{max_sequence_length}. Truncate it (the preprocessor does so for raw text)."
        )


def is_concrete_features(x):
    """Whether `x` is a dict of concrete arrays (checkable now)."""
    return isinstance(x, dict) and all(backend_support.is_concrete(v) for v in x.values())


def _without_mixed_types(inputs):
    """A feature dict whose numpy arrays are made tensors when others are
    tensors already (Keras refuses a mix, yet a caller feeding a model's
    output back — Transformer-XL's memory — with new numpy ids makes one)."""
    if not isinstance(inputs, dict):
        return inputs
    is_array = [isinstance(v, (np.ndarray, list)) for v in inputs.values()]
    if all(is_array) or not any(is_array):
        return inputs
    return {k: keras.ops.convert_to_tensor(v) if isinstance(v, (np.ndarray, list)) else v for k, v in inputs.items()}


class ValidatesInputs:
    """Mixin for `keras.Model`s: `validate_inputs` runs on concrete feature
    dicts given to `__call__`, `fit`, `evaluate` and `predict`."""

    def validate_inputs(self, inputs):
        """Checks concrete inputs (ids in range, lengths); raises `ValueError`."""

    def _validate_if_concrete(self, x):
        if is_concrete_features(x):
            self.validate_inputs(x)

    def __call__(self, inputs, *args, **kwargs):
        self._validate_if_concrete(inputs)
        return super().__call__(_without_mixed_types(inputs), *args, **kwargs)

    def fit(self, x=None, *args, **kwargs):
        self._validate_if_concrete(x)
        return super().fit(x, *args, **kwargs)

    def evaluate(self, x=None, *args, **kwargs):
        self._validate_if_concrete(x)
        return super().evaluate(x, *args, **kwargs)

    def predict(self, x, *args, **kwargs):
        self._validate_if_concrete(x)
        return super().predict(x, *args, **kwargs)
