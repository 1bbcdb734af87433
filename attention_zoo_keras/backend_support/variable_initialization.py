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
consults the innermost active mapping.

A checkpoint's tensors are copy-on-write memory maps
(`hub.weights.Checkpoint`), so the weights are in memory once:
- On torch the variable takes the array's own memory (a converter's
  transposed view included) when no other variable holds it: nothing is
  read until used.
- On JAX on a CPU, `jax.device_put` takes a C-ordered array aligned to 64
  bytes as its buffer (the library writes its presets so that tensors are).
- Where the backend copies (TensorFlow, an unaligned or strided array, an
  accelerator), the mapped pages are dropped after the copy.
- On JAX under a `keras.distribution`, the host array goes straight into the
  variable's shards, never whole onto one device.
"""

import contextlib
import mmap
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


def _release_pages(array):
    """Drops from this process the pages of the memory map `array` views
    (the copy-on-write mapping a checkpoint reader returned) once its values
    have been copied into a variable: while mapped they count as the
    process' memory, which would then hold the weights twice. Pages come
    back from the file when read again, so this is only for mappings that
    nothing has written to (as during a load: a private mapping's written
    pages would be lost). Does nothing for other arrays or where the system
    cannot."""
    while isinstance(array, np.ndarray) and not isinstance(array, np.memmap):
        array = array.base
    mapping = getattr(array, "_mmap", None)
    if isinstance(mapping, mmap.mmap) and hasattr(mmap, "MADV_DONTNEED") and not mapping.closed:
        mapping.madvise(mmap.MADV_DONTNEED)


def _memory_root(array):
    """An id of the buffer `array` views (a memory map, or an array that
    owns its memory)."""
    while isinstance(array.base, np.ndarray):
        array = array.base
    return id(array if array.base is None else array.base)


def _torch_value(state, value, shareable):
    """A torch tensor on `value`'s own memory (Keras' conversion would copy
    it) where `shareable` and no variable created before holds any of that
    memory; otherwise on a copy. Strided views (a converter's transposed
    kernels) stay views: torch computes with them as they are."""
    import torch

    if shareable:
        others = state.shared.setdefault(_memory_root(value), [])
        shareable = not any(np.shares_memory(value, other) for other in others)
    try:
        if shareable:
            others.append(value)
            return torch.from_numpy(value)
        return torch.from_numpy(np.array(value))
    except TypeError:  # a numpy dtype torch lacks (ml_dtypes' bfloat16): Keras converts it
        return value


def _backend_value(state, variable, value, shareable):
    """`(value as the variable's backend value, whether that is a copy)`."""
    backend = backend_name()
    if backend == "torch":
        tensor = _torch_value(state, value, shareable)
        return tensor, not (hasattr(tensor, "data_ptr") and tensor.data_ptr() == value.ctypes.data)
    if backend == "jax":
        if keras.distribution.distribution() is not None:
            return value, True  # Keras places the host array straight into the variable's shards
        import jax

        # On a CPU, a C-ordered host array aligned to 64 bytes becomes the
        # buffer without a copy (a memory map: read when used).
        array = jax.device_put(value)
        aliased = array.devices() == {jax.devices("cpu")[0]} and array.unsafe_buffer_pointer() == value.ctypes.data
        if not aliased:
            array.block_until_ready()  # the copy is done before the host pages are dropped
        return array, not aliased
    return variable._convert_to_tensor(value), True


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
        value = np.asarray(array, dtype=variable.dtype)
        # A value nothing else holds (converted here, or a reader's fresh
        # array) may become the variable's memory.
        shareable = value is not array or getattr(arrays, "reads_fresh_arrays", False)
        backend_value, copied = _backend_value(state, variable, value, shareable and value.flags.writeable)
        variable._initialize(backend_value)
        if copied or value is not array:
            _release_pages(array)  # the variable holds a copy: the mapped pages are not needed
        state.filled.add(id(variable))

    initialize.wraps_checkpoint_values = True
    return initialize


class _Initialization:
    def __init__(self, arrays):
        self.arrays = arrays
        self.filled = set()
        self.shared = {}  # {memory root: arrays whose memory torch variables took}

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
