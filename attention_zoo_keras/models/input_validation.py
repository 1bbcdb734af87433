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


def _sequence_length(x):
    """The sequence length of `fit` / `evaluate` / `predict` data: a feature
    dict's `token_ids`, or the length its preprocessor pads raw text to;
    `None` if unknown."""
    if isinstance(x, dict) and "token_ids" in x:
        return np.shape(x["token_ids"])[-1]
    preprocessor = getattr(x, "preprocessor", None)
    return getattr(preprocessor, "sequence_length", None)


class ValidatesInputs:
    """Mixin for `keras.Model`s: `validate_inputs` runs on concrete feature
    dicts given to `__call__`, `fit`, `evaluate` and `predict`; an error
    raised while those loops run (a bad batch) leaves the model's weights in
    place (`backend_support.variables_restored_on_error`).

    A backbone whose graph needs a static sequence length (the Reformer's
    chunked attention) sets `static_sequence_length = True`: on a backend
    whose compiled functions relax shapes (`backend_support.relaxes_traced_shapes`)
    its model's `fit` / `evaluate` / `predict` functions are then made anew
    whenever the length changes.
    """

    static_sequence_length = False

    def validate_inputs(self, inputs):
        """Checks concrete inputs (ids in range, lengths); raises `ValueError`."""

    def _validate_if_concrete(self, x):
        if is_concrete_features(x):
            self.validate_inputs(x)

    def _prepare_functions(self, x):
        """Validates `fit` / `evaluate` / `predict` data, and drops compiled
        functions traced for another length where the length must be static."""
        self._validate_if_concrete(x)
        backbone = getattr(self, "backbone", self)
        if getattr(backbone, "static_sequence_length", False) and backend_support.relaxes_traced_shapes():
            length = _sequence_length(x)
            if length is not None and length != getattr(self, "_traced_sequence_length", None):
                self.train_function = self.test_function = self.predict_function = None
                self._traced_sequence_length = length

    def __call__(self, inputs, *args, **kwargs):
        self._validate_if_concrete(inputs)
        return super().__call__(_without_mixed_types(inputs), *args, **kwargs)

    def fit(self, x=None, *args, **kwargs):
        self._prepare_functions(x)
        with backend_support.variables_restored_on_error(self):
            return super().fit(x, *args, **kwargs)

    def evaluate(self, x=None, *args, **kwargs):
        self._prepare_functions(x)
        with backend_support.variables_restored_on_error(self):
            return super().evaluate(x, *args, **kwargs)

    def predict(self, x, *args, **kwargs):
        self._prepare_functions(x)
        with backend_support.variables_restored_on_error(self):
            return super().predict(x, *args, **kwargs)
