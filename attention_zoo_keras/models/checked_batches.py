"""Batches checked as they are produced, whatever carries them to `fit`,
`evaluate` or `predict`.

Concrete arrays are checked once, before a loop starts. A Python generator,
a `keras.utils.PyDataset`, a `tf.data.Dataset` or a torch `DataLoader`
makes its batches while the loop runs, so each is wrapped to run a model's
checks on every batch before the batch reaches the compiled step (where
JAX would turn an out-of-range id into NaN). The wrapper keeps the data's
length, its epochs and its shuffling. A batch of raw inputs (texts, images)
is first made the model's features by its preprocessor (`BatchCheck.prepare`),
so a stream of raw batches trains a task as raw arrays do.

`tf.data` and torch are imported by nobody here: a dataset of theirs
reaches this module only once the user has imported them, and they are
taken from `sys.modules`.
"""

import contextlib
import copy
import functools
import sys
import types

import keras
import numpy as np

from attention_zoo_keras import backend_support


class BatchCheck:
    """A model's checks of one batch (`x`, `(x,)`, `(x, y)` or
    `(x, y, sample_weight)`) that remembers the last error (`failure`), so
    the error can reach the caller as itself (see `original_batch_errors`).

    Args:
        validate_batch: callable. Called with each batch; raises on a bad
            one.
        prepare_batch: callable or None. Makes a batch what the model takes
            (a raw batch preprocessed) before it is checked; `None`: batches
            are taken as they are.
        widths_vary: bool. Whether prepared batches may differ in width (a
            preprocessor that pads each batch to its bucket length).
    """

    def __init__(self, validate_batch, prepare_batch=None, widths_vary=False):
        self.validate_batch = validate_batch
        self.prepare = prepare_batch or (lambda batch: batch)
        self.widths_vary = widths_vary
        self.failure = None

    def produce(self, make_batch, *args):
        """`make_batch(*args)`, prepared and checked; an error making,
        preparing or checking it is kept in `failure`."""
        try:
            batch = self.prepare(make_batch(*args))
            self.validate_batch(batch)
        except Exception as error:
            self.failure = error
            raise
        return batch

    def __call__(self, batch):
        """`batch`, prepared and checked."""
        return self.produce(lambda: batch)


class CheckedPyDataset(keras.utils.PyDataset):
    """A `keras.utils.PyDataset` whose batches pass `check`: the wrapped
    dataset's length, workers and epoch hooks (its reshuffling) are kept.

    Args:
        data: keras.utils.PyDataset. The dataset to wrap.
        check: BatchCheck. The checks each batch passes.
    """

    def __init__(self, data, check):
        super().__init__(
            workers=data.workers, use_multiprocessing=data.use_multiprocessing, max_queue_size=data.max_queue_size
        )
        self.data = data
        self.check = check

    def __len__(self):
        return len(self.data)

    @property
    def num_batches(self):
        return self.data.num_batches

    def __getitem__(self, index):
        return self.check.produce(self.data.__getitem__, index)

    def on_epoch_begin(self):
        self.data.on_epoch_begin()

    def on_epoch_end(self):
        self.data.on_epoch_end()


def _checked_generator(generator, check):
    """A generator (Keras tells generators by their type) of `generator`'s batches, checked."""
    for batch in generator:
        yield check(batch)


def _prepared_tf_dataset(dataset, check, tf):
    """`dataset` of raw batches (strings, images) mapped through a numpy
    function that prepares (preprocesses) and checks each element, or `None`
    when its first element needs no preparing. The elements' structure and
    dtypes are those of the first prepared one, their batch axis (and a
    rank-2 array's width, which padding per batch varies) left unknown."""
    first = tf.nest.map_structure(lambda tensor: tensor.numpy(), next(iter(dataset)))
    prepared = check.prepare(first)
    if prepared is first:
        return None
    structure = tf.nest.map_structure(np.asarray, prepared)
    leaves = tf.nest.flatten(structure)

    def prepare_element(*parts):
        element = parts if isinstance(dataset.element_spec, tuple) else parts[0]
        flat = tf.nest.flatten(element)

        def prepare_arrays(*arrays):
            batch = check(tf.nest.pack_sequence_as(element, list(arrays)))
            return [np.asarray(value, dtype=leaf.dtype) for value, leaf in zip(tf.nest.flatten(batch), leaves)]

        outputs = tf.numpy_function(prepare_arrays, flat, [tf.as_dtype(leaf.dtype) for leaf in leaves], stateful=True)
        for output, leaf in zip(outputs, leaves):
            output.set_shape((None, None) if leaf.ndim == 2 else (None, *leaf.shape[1:]))
        return tf.nest.pack_sequence_as(structure, outputs)

    return dataset.map(prepare_element)


def _checked_tf_dataset(dataset, check, tf):
    """`dataset.map` with a numpy function that checks each element; the
    element passes on only after the check (a control dependency). Raw
    batches are prepared too (`_prepared_tf_dataset`)."""

    def check_element(*parts):  # `map` passes a tuple element's parts as arguments
        element = parts if isinstance(dataset.element_spec, tuple) else parts[0]
        leaves = tf.nest.flatten(element)

        def check_arrays(*arrays):
            check(tf.nest.pack_sequence_as(element, list(arrays)))
            return np.bool_(True)

        checked = tf.numpy_function(check_arrays, leaves, tf.bool, stateful=True)
        with tf.control_dependencies([checked]):
            return tf.nest.map_structure(tf.identity, element)

    if not all(isinstance(spec, tf.TensorSpec) for spec in tf.nest.flatten(dataset.element_spec)):
        return dataset  # ragged or sparse parts: a numpy function cannot take them
    if any(spec.dtype == tf.string for spec in tf.nest.flatten(dataset.element_spec)):
        prepared = _prepared_tf_dataset(dataset, check, tf)
        if prepared is not None:
            return prepared
    return dataset.map(check_element)


@functools.cache
def _checking_loader_class(loader_class):
    """A subclass of a torch `DataLoader` class whose iteration prepares and
    checks each batch (in the main process, after collation) with
    `batch_check`."""

    def __iter__(self):
        torch = sys.modules["torch"]
        for batch in super(checking, self).__iter__():
            batch = self.batch_check(_texts_as_lists(batch))
            # A preprocessed batch holds numpy arrays; Keras' loader adapters take tensors.
            yield keras.tree.map_structure(
                lambda value: torch.as_tensor(value) if isinstance(value, np.ndarray) else value, batch
            )

    checking = type(f"Checked{loader_class.__name__}", (loader_class,), {"__iter__": __iter__})
    return checking


def _texts_as_lists(batch):
    """A torch-collated batch with each tuple of strings made a list: torch's
    default collation gives a batch's texts as a tuple, which the library's
    preprocessors would read as the segments of one example (a text pair)."""
    if isinstance(batch, tuple) and batch and all(isinstance(item, str) for item in batch):
        return list(batch)
    if isinstance(batch, (list, tuple)):
        return type(batch)(_texts_as_lists(item) for item in batch)
    return batch


def _checked_data_loader(loader, check):
    """A copy of a torch `DataLoader` (same dataset, sampler, workers; Keras
    still sees a `DataLoader` and its length) whose batches pass `check`."""
    checked = copy.copy(loader)
    checked.__class__ = _checking_loader_class(type(loader))
    checked.batch_check = check
    return checked


def checked(data, check):
    """`data` whose batches are prepared and pass `check` as they are
    produced: a generator, a `keras.utils.PyDataset`, a `tf.data.Dataset`
    or a torch `DataLoader` is wrapped; anything else is returned as it is
    (concrete arrays are checked whole, before the loop). A generator,
    `PyDataset` or `DataLoader` whose batches may differ in width (raw
    inputs padded per batch) becomes what this backend takes with batches of any width
    (`backend_support.batches_of_any_width`)."""
    if isinstance(data, types.GeneratorType):
        batches = _checked_generator(data, check)
        return backend_support.batches_of_any_width(batches) if check.widths_vary else batches
    if isinstance(data, keras.utils.PyDataset):
        batches = CheckedPyDataset(data, check)
        varies = getattr(data, "widths_vary", False) or check.widths_vary
        return backend_support.batches_of_any_width(batches) if varies else batches
    tf = sys.modules.get("tensorflow")
    if tf is not None and isinstance(data, tf.data.Dataset):
        return _checked_tf_dataset(data, check, tf)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(data, torch.utils.data.DataLoader):
        loader = _checked_data_loader(data, check)
        return backend_support.batches_of_any_width(loader) if check.widths_vary else loader
    return data


@contextlib.contextmanager
def original_batch_errors(check):
    """Lets an error raised while making or checking a batch reach the
    caller as itself: TensorFlow's data pipeline (which carries generators,
    `PyDataset`s and `DataLoader`s on that backend, and `tf.data` on all)
    re-raises it as its own error type, with the original only in the
    message."""
    check.failure = None
    try:
        yield
    except Exception as error:
        if check.failure is not None and check.failure is not error:
            raise check.failure from error
        raise
