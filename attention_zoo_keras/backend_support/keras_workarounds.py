"""Where Keras needs help: weights kept usable after a failed `fit` (JAX),
batches whose width varies (TensorFlow), LiteRT exported more than once in
a process (torch), and a layer's `autocast = False` honoured on every
path (all backends)."""

import contextlib
import importlib.util
import itertools
import types

import keras
import numpy as np

from attention_zoo_keras.backend_support.environment import backend_name


@contextlib.contextmanager
def variables_restored_on_error(model):
    """Runs a Keras `fit` / `evaluate` / `predict` of `model` so that an
    exception in the middle (a bad batch from a preprocessor) leaves the
    model usable.

    On JAX, Keras detaches every variable's value while those loops run (the
    compiled steps take the state as arguments and donate it) and reattaches
    the latest state at the end; an exception in between would leave the
    variables empty. Here the latest state Keras kept (`_jax_state`) is put
    back, and variables the loop had not reached yet get the value they had
    before the call (references, not copies: buffers the loop donated are
    not held). Other backends keep their variables attached. `model` is a
    `JaxTrainerState` (its variables are listed once per set of steps).
    """
    if backend_name() != "jax":
        yield
        return
    before = [(variable, variable._value) for kind in model._state_variables().values() for variable in kind]
    try:
        yield
    except BaseException:
        if getattr(model, "_jax_state", None):
            model.jax_state_sync()
        for variable, value in before:
            if variable._value is None:
                variable._value = value
        model._jax_state = None
        raise


def batches_of_any_width(batches):
    """`batches` (a `keras.utils.PyDataset`, a generator or a torch
    `DataLoader` whose batches may differ in width, e.g. text padded per
    batch to a bucket length) in a form this backend's `fit` / `evaluate` /
    `predict` take whatever the widths.

    On TensorFlow, Keras' adapters of these fix every array's shape from the
    first batches (keras-team/keras#19124), so a later, wider batch is
    refused. There the batches become a `tf.data.Dataset` (of the same
    length and calling the epoch hooks of a `PyDataset`; read once, as Keras
    reads a generator) whose arrays of rank
    2 (token ids, masks, segment ids, per-token weights) have their second
    axis unknown too; arrays of other ranks keep their shapes but the batch
    axis. Elsewhere `batches` is returned as it is.
    """
    if backend_name() != "tensorflow":
        return batches
    import tensorflow as tf

    def spec(array):
        array = np.asarray(array)
        shape = (None, None) if array.ndim == 2 else (None, *array.shape[1:])
        return tf.TensorSpec(shape, tf.as_dtype(array.dtype))

    if isinstance(batches, types.GeneratorType):
        first = _lists_as_tuples(next(batches))
        signature = tf.nest.map_structure(spec, first)
        every_batch = itertools.chain([first], map(_lists_as_tuples, batches))  # one pass, as Keras reads a generator
        return tf.data.Dataset.from_generator(lambda: every_batch, output_signature=signature)
    if not isinstance(batches, keras.utils.PyDataset):  # a torch DataLoader: iterable again, with a length
        signature = tf.nest.map_structure(spec, _lists_as_tuples(next(iter(batches))))
        dataset = tf.data.Dataset.from_generator(lambda: map(_lists_as_tuples, batches), output_signature=signature)
        return dataset.apply(tf.data.experimental.assert_cardinality(len(batches)))

    def generate():
        batches.on_epoch_begin()
        for index in range(len(batches)):
            yield batches[index]
        batches.on_epoch_end()

    signature = tf.nest.map_structure(spec, batches[0])
    dataset = tf.data.Dataset.from_generator(generate, output_signature=signature)
    return dataset.apply(tf.data.experimental.assert_cardinality(len(batches)))


def _lists_as_tuples(batch):
    """`batch` with its lists made tuples (a torch `DataLoader` collates an
    `(x, y)` example into a list), the structures `tf.data` takes."""
    if isinstance(batch, (list, tuple)):
        return tuple(_lists_as_tuples(item) for item in batch)
    if isinstance(batch, dict):
        return {key: _lists_as_tuples(value) for key, value in batch.items()}
    return batch


@contextlib.contextmanager
def litert_export_settings(export_format):
    """Runs a Keras `model.export(..., format=export_format)` so that LiteRT
    from torch works at every call, not only the first.

    Keras (3.15) converts torch models with `litert_torch`, which turns
    JAX's 64-bit mode on when it is first imported and needs it on while it
    converts; Keras puts back the mode it found before the export, so every
    later export in the process converts with it off and fails ("'func.call'
    op operand type mismatch: expected operand type 'tensor<8x10xi32>', but
    provided 'tensor<8x10xi64>'"). Here the mode is on during the export, as
    at the first, and put back after it. Other formats and backends are left
    alone.
    """
    if export_format != "litert" or backend_name() != "torch" or importlib.util.find_spec("jax") is None:
        yield
        return
    import jax

    before = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        yield
    finally:
        jax.config.update("jax_enable_x64", before)


def variables_in_their_own_dtype():
    """A context in which Keras variables are read in their own dtype (no
    mixed-precision autocast), for a layer that asks not to be autocast.

    Keras' `Layer.__call__` honours a layer's `autocast = False` only inside
    an outer autocast scope: called on its own, or from a model's
    `stateless_call` (which Keras' training and prediction steps run), a
    layer whose dtype policy is mixed opens a scope of its compute dtype
    itself, so its float32 variables are read as bfloat16 all the same.
    """
    from keras.src.backend import AutocastScope

    return AutocastScope(None)
