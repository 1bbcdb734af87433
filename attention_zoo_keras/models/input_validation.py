"""Checks of concrete model inputs, made before they reach a compiled graph.

Gathers on JAX silently clamp out-of-range indices (and TensorFlow fails deep
inside the graph), a float id is silently truncated, and a mask of another
shape fails inside Keras' attention layer; so token ids, masks, segment
ids, positions, lengths and class labels are checked on concrete values in
numpy, where the error can name the input. Each check is one pass over the
values (a min and a max) where it can be. A model runs them on every input
path through the mixin `validates_inputs.ValidatesInputs`.
"""

import keras
import numpy as np

from attention_zoo_keras import backend_support


def as_numpy(values):
    """`values` (an array, a nested list, a number, a tensor of this backend
    or, as a torch `DataLoader` gives on another backend, of another
    framework) as a numpy array."""
    if isinstance(values, (list, tuple, np.ndarray, np.generic, int, float)) or not backend_support.is_concrete(values):
        return np.asarray(values)
    return keras.ops.convert_to_numpy(values)


def concrete_shape(value):
    """The concrete shape of an array, tensor or nested list, as a tuple."""
    shape = getattr(value, "shape", None)
    return tuple(shape) if shape is not None else tuple(np.shape(value))


def _check_integers(name, ids):
    """Raises unless the numpy array `ids` holds whole numbers: an integer
    dtype, or floats with integer values (as numpy and pandas load ids); any
    other float would be truncated silently by the model's cast."""
    kind = ids.dtype.kind
    if kind in "iu":
        return
    if kind == "f":
        whole = np.isfinite(ids) & (ids == np.trunc(ids))
        if not whole.all():
            raise ValueError(
                f"'{name}' holds {ids[~whole].flat[0].item():g}, not a whole number: ids must be integers "
                "(a float id would be truncated)."
            )
        return
    hint = " Tokenize text with the preprocessor first." if kind in "USO" else ""
    raise ValueError(f"'{name}' has dtype {ids.dtype}; ids must be integers.{hint}")


def check_id_range(name, ids, upper):
    """Raises if `ids` are not whole numbers, or any is negative or ≥ `upper`."""
    ids = as_numpy(ids)
    if ids.size == 0:
        return
    _check_integers(name, ids)
    low, high = ids.min(), ids.max()
    if low < 0 or high >= upper:
        bad = high if high >= upper else low
        raise ValueError(f"'{name}' holds the id {int(bad)}, outside the valid range [0, {upper}).")


def check_mask(name, mask):
    """Raises unless `mask` holds only 1 (attend) and 0 (padding, ignored)."""
    mask = as_numpy(mask)
    if mask.size == 0 or mask.dtype.kind == "b":
        return
    if mask.dtype.kind in "iu":
        low, high = mask.min(), mask.max()
        bad = low if low < 0 else high if high > 1 else None
    elif mask.dtype.kind == "f":
        invalid = (mask != 0) & (mask != 1)
        bad = mask[invalid].flat[0] if invalid.any() else None
    else:
        raise ValueError(f"'{name}' has dtype {mask.dtype}; a mask holds 1 (attend) or 0 (padding).")
    if bad is not None:
        raise ValueError(f"'{name}' holds {bad.item():g}; a mask holds only 1 (attend) or 0 (padding).")


def check_same_shape(inputs, reference, names):
    """Raises if any of `names` present in `inputs` has another shape than
    `inputs[reference]` (a mask or segment ids go with their token ids)."""
    expected = concrete_shape(inputs[reference])
    for name in names:
        if inputs.get(name) is not None and concrete_shape(inputs[name]) != expected:
            raise ValueError(
                f"'{name}' has shape {concrete_shape(inputs[name])} but '{reference}' has shape {expected}; "
                "they must match, one value per token."
            )


def check_class_labels(labels, num_classes, kind="classes"):
    """Raises unless `labels` are class indices in `[0, num_classes)` (shape
    `(batch,)` or `(batch, 1)`) or one-hot / probability rows `num_classes`
    wide; `kind` names the classes in the message (`"candidates"`)."""
    labels = as_numpy(labels)
    if labels.size == 0:
        return
    if labels.ndim >= 2 and labels.shape[-1] != 1:
        if labels.shape[-1] != num_classes:
            raise ValueError(
                f"The labels have shape {labels.shape}: one-hot rows {labels.shape[-1]} wide, but there are "
                f"{num_classes} {kind}. Give indices, or rows {num_classes} wide."
            )
        return
    _check_integers("labels", labels)
    low, high = labels.min(), labels.max()
    if low < 0 or high >= num_classes:
        bad = high if high >= num_classes else low
        raise ValueError(
            f"The labels hold the class {int(bad)}; there are {num_classes} {kind} (indices 0 to {num_classes - 1})."
        )


def check_soft_targets(labels, width=None):
    """Raises unless `labels` are scores in [0, 1] (soft targets of a
    sigmoid head), rows `width` wide when `width` is given."""
    labels = as_numpy(labels)
    if width is not None and (labels.ndim < 2 or labels.shape[-1] != width):
        raise ValueError(f"The labels have shape {labels.shape}; they must be rows of {width} scores.")
    if labels.size == 0:
        return
    inside = (labels >= 0) & (labels <= 1)
    if not inside.all():
        raise ValueError(f"The labels hold {labels[~inside].flat[0].item():g}; soft targets are scores in [0, 1].")


def check_sequence_length(name, ids, max_sequence_length):
    """Raises if `ids` is longer than the model's maximum sequence length."""
    length = concrete_shape(ids)[-1]
    if length is not None and length > max_sequence_length:
        raise ValueError(
            f"'{name}' has length {length}, longer than the model's maximum sequence length "
            f"{max_sequence_length}. Truncate it (the preprocessor does so for raw text)."
        )


def check_token_inputs(inputs, vocabulary_size, max_sequence_length=None, prefix="", num_segments=None):
    """Checks `inputs["<prefix>token_ids"]` (whole ids in range, no longer
    than `max_sequence_length` when given) and what goes with them, one
    value per token: `<prefix>padding_mask` (0 or 1) and, when `num_segments`
    is given, `segment_ids` (in range)."""
    ids_name, mask_name = f"{prefix}token_ids", f"{prefix}padding_mask"
    companions = (mask_name, "segment_ids") if num_segments is not None else (mask_name,)
    check_same_shape(inputs, ids_name, companions)
    if max_sequence_length is not None:
        check_sequence_length(ids_name, inputs[ids_name], max_sequence_length)
    check_id_range(ids_name, inputs[ids_name], vocabulary_size)
    if inputs.get(mask_name) is not None:
        check_mask(mask_name, inputs[mask_name])
    if num_segments is not None and inputs.get("segment_ids") is not None:
        check_id_range("segment_ids", inputs["segment_ids"], num_segments)
