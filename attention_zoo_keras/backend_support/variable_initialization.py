"""Variables created with a checkpoint's values instead of random ones.

Building a model draws every weight from its initializer, which a load then
overwrites: for BERT-base on a CPU that drawing is most of the load (Keras'
truncated normal on torch: 8 of 9.5 s), and the model's memory is allocated
twice. Inside `initialized_from(arrays)`, a Keras variable whose path is a
key of `arrays`, with the same shape and the same kind (integer or float),
is created holding `arrays[path]` in its own dtype; any other variable (a
fresh task head, a tensor the checkpoint lacks or holds in another shape,
which the strict load then reports) draws from its initializer as usual.

Keras creates a variable's value in `Variable._initialize_with_initializer`
on every backend; this module wraps that method (once, on first use) and
consults the innermost active mapping. On torch the variable takes the
array's own memory when nothing else holds it (a checkpoint's tensors are
copy-on-write memory maps, `hub.weights.Checkpoint`: nothing is read until
used, and the weights are in memory once). On JAX under a
`keras.distribution`, the host array goes straight into the variable's
shards (`jax.device_put` with its sharding), never whole onto one device.
"""

import contextlib
import threading

import keras
import numpy as np

from attention_zoo_keras.backend_support.environment import backend_name

_active = threading.local()


def is_integer_dtype(dtype):
    """Whether `dtype` (a numpy, Keras or backend dtype) holds integers or
    booleans rather than floats."""
    return keras.backend.standardize_dtype(dtype).startswith(("int", "uint", "bool"))


def _shape_of(arrays, key):
    """The shape of `arrays[key]`, from a header where the mapping reads
    lazily (`shape(key)`), without reading the tensor."""
    shape = getattr(arrays, "shape", None)
    return tuple(shape(key)) if callable(shape) else tuple(arrays[key].shape)


def _torch_tensor_sharing(value):
    """`value` as a torch tensor on its memory (Keras' conversion would copy
    it); numpy dtypes torch lacks (ml_dtypes' bfloat16) are converted."""
    import torch

    try:
        return torch.from_numpy(value)
    except TypeError:
        return value


def _initialize_with_checkpoint_value(original):
    def initialize(variable, initializer):
        state = getattr(_active, "state", None)
        if state is None or variable.path not in state.arrays:
            return original(variable, initializer)
        arrays, key = state.arrays, variable.path
        if _shape_of(arrays, key) != tuple(variable.shape):
            return original(variable, initializer)
        array = arrays[key]
        if is_integer_dtype(array.dtype) != is_integer_dtype(variable.dtype):
            return original(variable, initializer)
        value = np.asarray(array, dtype=variable.dtype, order="C")  # a converter's transposes are views
        backend = backend_name()
        if backend == "jax" and keras.distribution.distribution() is not None:
            variable._initialize(value)  # host to shards
        elif backend == "torch":
            # The variable takes the array's memory where nothing else holds
            # the array (a copy made here, or a reader's fresh array), so the
            # weights are in memory once; Keras' conversion would copy.
            owned = value is not array or getattr(arrays, "reads_fresh_arrays", False)
            variable._initialize(_torch_tensor_sharing(value) if owned and value.flags.writeable else value)
        else:
            variable._initialize(variable._convert_to_tensor(value))
        state.filled.add(id(variable))

    initialize.wraps_checkpoint_values = True
    return initialize


class _Initialization:
    def __init__(self, arrays):
        self.arrays = arrays
        self.filled = set()

    def was_filled(self, variable):
        """Whether `variable` was created holding its checkpoint value."""
        return id(variable) in self.filled


@contextlib.contextmanager
def initialized_from(arrays):
    """Variables created in this block whose path is a key of `arrays` (with
    the same shape and kind) start with that value, in their own dtype.

    Yields an object whose `was_filled(variable)` says which were, so a load
    need not read or assign them again.

    Example:

    >>> with initialized_from(checkpoint) as initialization:   # doctest: +SKIP
    ...     backbone = BertBackbone.from_config(config)          # doctest: +SKIP
    """
    variable_cls = keras.Variable
    if not getattr(variable_cls._initialize_with_initializer, "wraps_checkpoint_values", False):
        variable_cls._initialize_with_initializer = _initialize_with_checkpoint_value(
            variable_cls._initialize_with_initializer
        )
    outer = getattr(_active, "state", None)
    _active.state = _Initialization(arrays)
    try:
        yield _active.state
    finally:
        _active.state = outer
