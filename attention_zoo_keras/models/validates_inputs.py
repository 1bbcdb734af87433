"""`ValidatesInputs`: the mixin that makes every input path of a model run
its checks (`input_validation`) on concrete values before they reach a
compiled graph: `__call__`, `fit` / `evaluate` / `predict` and the
`*_on_batch` methods, and the batches of generators and datasets
(`checked_batches`). It also takes the input structure a user may expect to
work: a lone input given bare, optional inputs left out.
"""

import inspect

import keras
import numpy as np

from attention_zoo_keras import backend_support
from attention_zoo_keras.models.checked_batches import BatchCheck
from attention_zoo_keras.models.checked_batches import checked
from attention_zoo_keras.models.checked_batches import original_batch_errors
from attention_zoo_keras.models.input_validation import as_numpy
from attention_zoo_keras.models.input_validation import concrete_shape
from attention_zoo_keras.models.text_preprocessor import is_text
from attention_zoo_keras.naming import did_you_mean


def is_concrete_features(x):
    """Whether `x` is a dict of concrete arrays (checkable now; `None` for
    an optional input left out)."""
    return isinstance(x, dict) and all(v is None or backend_support.is_concrete(v) for v in x.values())


def _without_mixed_types(inputs):
    """A feature dict whose numpy arrays are made tensors when others are
    tensors already (Keras refuses a mix, yet a caller feeding a model's
    output back — Transformer-XL's memory — with new numpy ids makes one)."""
    if not isinstance(inputs, dict):
        return inputs
    is_array = [isinstance(v, (np.ndarray, list)) for v in inputs.values() if v is not None]
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


def _no_examples(x):
    """Why `x` holds no examples (`"x=None"`, `"'token_ids' has 0 rows"`, …),
    or `None` when it may hold some."""
    if x is None:
        return "x=None"
    if isinstance(x, (list, tuple, dict)) and len(x) == 0:
        return f"x={x!r}"
    if isinstance(x, keras.utils.PyDataset) and x.num_batches == 0:
        return "a dataset of 0 batches"
    for name, value in x.items() if isinstance(x, dict) else [("x", x)]:
        arrays = not isinstance(value, (list, tuple)) and backend_support.is_concrete(value)
        if arrays and concrete_shape(value)[:1] == (0,):
            return f"'{name}' has 0 rows"
    return None


def _input_names(model):
    """The names of `model`'s inputs when they are a dict, else `None`."""
    try:
        inputs = model.input
    except (AttributeError, ValueError):
        return None
    return list(inputs) if isinstance(inputs, dict) else None


def _optional_input_names(model):
    """The names of `model`'s inputs that may be left out (`keras.Input(..., optional=True)`)."""
    return {layer.name for layer in model.layers if isinstance(layer, keras.layers.InputLayer) and layer.optional}


def _lone_input_name(model):
    """The name of `model`'s one required input when it takes a dict with
    exactly one (a ViT's `images`, Transformer-XL's `token_ids`), else `None`."""
    names = _input_names(model)
    if names is None:
        return None
    required = [name for name in names if name not in _optional_input_names(model)]
    return required[0] if len(required) == 1 else None


class ValidatesInputs:
    """Mixin for `keras.Model`s: every batch of every input path is checked
    before it reaches a compiled graph — concrete feature dicts given to
    `__call__`, `fit`, `evaluate`, `predict` and the `*_on_batch` methods
    (checked whole), and the batches of a generator, a
    `keras.utils.PyDataset`, a `tf.data.Dataset` or a torch `DataLoader`
    (checked as they are produced, `checked_batches`). A check is the
    model's `validate_inputs` on the features (after their names) and
    `validate_labels` on the labels. A model with one required input takes
    it bare as well as in its dict (`as_features`). An error raised while
    those loops run (a bad batch) reaches the caller as itself, and leaves
    the model's weights in place (`backend_support.variables_restored_on_error`).

    A backbone whose graph needs a static sequence length (the Reformer's
    chunked attention) sets `static_sequence_length = True`: on a backend
    whose compiled functions relax shapes (`backend_support.relaxes_traced_shapes`)
    its model's `fit` / `evaluate` / `predict` functions are then made anew
    whenever the length changes.
    """

    static_sequence_length = False

    def validate_inputs(self, inputs):
        """Checks concrete inputs (ids in range, masks, lengths); raises `ValueError`."""

    def validate_labels(self, labels, inputs=None):
        """Checks concrete labels (e.g. class indices in range) of a batch
        whose feature dict is `inputs` (`None` where there is none); raises
        `ValueError`."""

    def _check_input_names(self, inputs):
        """Raises on a feature name the model does not take, or a missing one
        (Keras would ignore the first and fail obscurely on the second)."""
        expected = _input_names(self)
        if expected is None:
            return
        unknown = sorted(name for name in inputs if name not in expected)
        if unknown:
            raise ValueError(
                f"{type(self).__name__} has no input named '{unknown[0]}'.{did_you_mean(unknown[0], expected)} "
                f"Its inputs: {', '.join(expected)}."
            )
        optional = _optional_input_names(self)
        missing = [name for name in expected if name not in inputs and name not in optional]
        if missing:
            raise ValueError(
                f"{type(self).__name__} needs the input{'s' if len(missing) > 1 else ''} "
                f"{', '.join(repr(name) for name in missing)}; got only {', '.join(map(repr, inputs)) or 'none'}."
            )

    def as_features(self, x):
        """`x` as the feature dict this model takes: a lone array or tensor
        given to a model with one required input (a ViT's `images`) becomes
        `{name: x}`, so that it is checked like the dict and reaches Keras
        without its input-structure warning; anything else is returned as
        it is."""
        if isinstance(x, (dict, list, tuple)) or not hasattr(x, "shape"):
            return x
        name = _lone_input_name(self)
        return x if name is None else {name: x}

    def _graph_inputs(self, inputs):
        """`as_features(inputs)`, with `None` for each optional input a dict
        leaves out (Transformer-XL's `reset_memory`): the structure Keras'
        functional call takes without a warning."""
        inputs = self.as_features(inputs)
        if not isinstance(inputs, dict):
            return inputs
        left_out = [name for name in _optional_input_names(self) if name not in inputs]
        return {**inputs, **dict.fromkeys(left_out)} if left_out else inputs

    def validate_batch(self, batch):
        """Checks one batch, `x`, `(x, y)` or `(x, y, sample_weight)`: the
        names and values of a feature dict `x` (or of a lone array, see
        `as_features`), and labels `y`."""
        x, y, _ = keras.utils.unpack_x_y_sample_weight(batch)
        x = self.as_features(x)
        if isinstance(x, dict):
            x = {name: None if value is None else as_numpy(value) for name, value in x.items()}
            self._check_input_names(x)
            self.validate_inputs(x)
        if y is not None:
            self.validate_labels(keras.tree.map_structure(as_numpy, y), x if isinstance(x, dict) else None)

    def _batch_check(self):
        """The checks each batch of a generator or dataset passes
        (`checked_batches.BatchCheck`): `validate_batch`, on the batch as it is."""
        return BatchCheck(self.validate_batch)

    def _validate_if_concrete(self, x):
        """Checks the names and values of `x` when it is a dict of concrete
        arrays (not the symbolic tensors of a graph being built or traced)."""
        if is_concrete_features(x):
            self._check_input_names(x)
            self.validate_inputs(x)

    def _require_inputs(self, method, x):
        """Raises the library's error for absent or empty inputs (Keras' own
        loops fail on them with an `UnboundLocalError` or a `KeyError`), and
        for text given to a model without a preprocessor ("Unrecognized data
        type" from Keras)."""
        names = _input_names(self)
        features = "arrays" if names is None else f"a dict of arrays ({', '.join(names)})"
        has_preprocessor = getattr(self, "preprocessor", None) is not None
        empty = _no_examples(x)
        if empty is not None:
            raw = ", raw inputs for the attached preprocessor" if has_preprocessor else ""
            raise ValueError(
                f"{type(self).__name__}.{method}() got no examples ({empty}). It takes {features}{raw}, or a "
                "generator, keras.utils.PyDataset, tf.data.Dataset or torch DataLoader of batches."
            )
        if not has_preprocessor and is_text(x):
            raise ValueError(
                f"{type(self).__name__}.{method}() got text, but the model has no preprocessor to tokenize it. "
                f"Give it {features}, or attach a preprocessor (`preprocessor=` when building it; "
                "`from_preset` attaches the preset's)."
            )

    def _checked_data(self, x, y, sample_weight, check):
        """`(x, y, sample_weight)` with `x`'s batches prepared and checked as
        they are produced; arrays (a feature dict `x`, labels `y`) are
        checked whole, now, and raw arrays (texts given to `*_on_batch`)
        prepared (preprocessed) first."""
        wrapped = checked(x, check)
        if wrapped is not x:
            return wrapped, y, sample_weight
        given = x if y is None and sample_weight is None else (x, y) if sample_weight is None else (x, y, sample_weight)
        prepared = check.prepare(given)
        if prepared is not given:
            check.validate_batch(prepared)
            return keras.utils.unpack_x_y_sample_weight(prepared)
        if isinstance(x, dict) or y is not None:
            check(x if y is None else (x, y))
        return x, y, sample_weight

    def _prepare_functions(self, x):
        """Drops compiled functions traced for another length where the length must be static."""
        backbone = getattr(self, "backbone", self)
        if getattr(backbone, "static_sequence_length", False) and backend_support.relaxes_traced_shapes():
            length = _sequence_length(x)
            if length is not None and length != getattr(self, "_traced_sequence_length", None):
                self.train_function = self.test_function = self.predict_function = None
                self._traced_sequence_length = length

    def _run_checked(self, method, args, kwargs):
        """Runs `keras.Model.<method>` with its data checked (see the class docstring)."""
        signature = inspect.signature(getattr(keras.Model, method))
        arguments = signature.bind(self, *args, **kwargs).arguments
        del arguments["self"]
        extra = arguments.pop("kwargs", {})
        self._require_inputs(method, arguments["x"])
        arguments["x"] = self.as_features(arguments["x"])
        check = self._batch_check()
        if method in ("fit", "evaluate", "predict"):
            self._prepare_functions(arguments["x"])
        x, y, sample_weight = self._checked_data(arguments["x"], arguments.get("y"), arguments.get("sample_weight"), check)
        arguments["x"] = x
        for name, value in (("y", y), ("sample_weight", sample_weight)):
            if name in signature.parameters and (value is not None or name in arguments):
                arguments[name] = value
        validation = arguments.get("validation_data")
        if isinstance(validation, (tuple, list)):
            check(tuple(validation))
        elif validation is not None:
            arguments["validation_data"] = checked(validation, check)
        with original_batch_errors(check), backend_support.variables_restored_on_error(self):
            return getattr(super(), method)(**arguments, **extra)

    def __call__(self, inputs, *args, **kwargs):
        inputs = self._graph_inputs(inputs)
        self._validate_if_concrete(inputs)
        return super().__call__(_without_mixed_types(inputs), *args, **kwargs)

    def call(self, inputs, training=None, mask=None, **kwargs):
        # JAX's compiled steps reach `call` through `stateless_call`, not
        # `__call__`. `training` stays in the signature: Keras' trainers pass
        # `training=True` only to a `call` that names it.
        return super().call(self._graph_inputs(inputs), training=training, mask=mask, **kwargs)

    def fit(self, *args, **kwargs):
        return self._run_checked("fit", args, kwargs)

    def evaluate(self, *args, **kwargs):
        return self._run_checked("evaluate", args, kwargs)

    def predict(self, *args, **kwargs):
        return self._run_checked("predict", args, kwargs)

    def train_on_batch(self, *args, **kwargs):
        return self._run_checked("train_on_batch", args, kwargs)

    def test_on_batch(self, *args, **kwargs):
        return self._run_checked("test_on_batch", args, kwargs)

    def predict_on_batch(self, *args, **kwargs):
        return self._run_checked("predict_on_batch", args, kwargs)
