"""The base class of preprocessors: raw inputs in, model features out."""

import inspect
import os
import tempfile
from pathlib import Path

import keras
import numpy as np

from attention_zoo_keras.hub.native_preset_loader import NativePresetLoader
from attention_zoo_keras.hub.preset_format import PREPROCESSOR_FILE
from attention_zoo_keras.hub.preset_format import write_preprocessor_files
from attention_zoo_keras.hub.preset_loader import get_preset_loader
from attention_zoo_keras.hub.source import PresetFileError
from attention_zoo_keras.hub.source import PresetSource
from attention_zoo_keras.models.preprocessed_batches import take
from attention_zoo_keras.registration import check_arguments
from attention_zoo_keras.registration import registered_class
from attention_zoo_keras.registration import serialize


def first_non_finite(values):
    """The index (a tuple) of the first NaN or infinite entry of `values`,
    or `None` when every entry is finite.

    >>> first_non_finite([[1.0, 2.0], [float("nan"), 0.0]]), first_non_finite([1, 2])
    ((1, 0), None)
    """
    bad = ~np.isfinite(np.asarray(values))
    return tuple(int(i) for i in np.argwhere(bad)[0]) if bad.any() else None


def check_per_example(name, values, batch):
    """`values` (labels or sample weights given with a batch of raw
    examples) as an array (a dict of them for a dict), checked to hold one
    entry per example."""
    if isinstance(values, dict):
        return {key: check_per_example(f"{name}['{key}']", value, batch) for key, value in values.items()}
    array = np.asarray(values)
    count = array.shape[0] if array.ndim else None
    if count != batch:
        held = "a scalar" if count is None else f"{count} entries"
        raise ValueError(f"{name} must have one entry per example: there are {batch} examples but {name} is {held}.")
    return array


def weighted(weights, sample_weight):
    """Per-position `weights` `(batch, width)` times a per-example
    `sample_weight` (checked to hold one weight per example), or `weights`
    when `sample_weight` is `None`."""
    if sample_weight is None:
        return weights
    per_example = check_per_example("sample_weight", sample_weight, weights.shape[0])
    return weights * per_example.astype("float32").reshape(-1, 1)


class Preprocessor:
    """Turns raw inputs into the feature dict a backbone takes.

    Called as `preprocessor(x, y=None, sample_weight=None)`, it returns what
    Keras expects from a dataset: `x`, `(x, y)` or `(x, y, sample_weight)`.
    Subclasses set `family` (and `tokenizer_cls` if they tokenize) and
    implement `__call__`, `is_raw`, `count_examples` and `get_config`.
    """

    tokenizer_cls = None
    family = None

    def __init__(self, tokenizer=None):
        self.tokenizer = tokenizer

    def is_raw(self, x):
        """Whether `x` is raw input this preprocessor should handle."""
        raise NotImplementedError

    @property
    def widths_vary(self):
        """Whether the batches it makes may differ in width: a text
        preprocessor with `padding="buckets"` pads each batch to its longest
        row's bucket (with `"max_length"`, and for images, every batch has
        one shape)."""
        return getattr(self, "padding", "max_length") != "max_length"

    def num_examples(self, x):
        """How many examples raw input `x` holds (`count_examples`).

        Raises `ValueError` for `None` and for input that holds no example:
        `fit` / `predict` could make no batch of it. A task checks raw input
        by calling this before it makes batches.
        """
        if x is None:
            raise ValueError(f"{type(self).__name__} got None instead of raw input: there is nothing to preprocess.")
        count = self.count_examples(x)
        if count == 0:
            raise ValueError(
                f"{type(self).__name__} got an empty {type(x).__name__}: the raw input holds no example, "
                "so there is nothing to preprocess."
            )
        return count

    def count_examples(self, x):
        """How many examples raw input `x` holds (0 if it is empty); raises
        if `x` is not raw input of this preprocessor."""
        raise NotImplementedError

    def as_batch(self, x):
        """Raw input `x` with its examples along its first axis: a single
        example (one string, one image) as a batch of one, so that `fit` /
        `predict` take whole examples from it and never index into one;
        other input as it is (nothing is copied or checked again)."""
        return x

    def examples(self, x, indices):
        """The raw examples at `indices` of raw input `x` (one batch of `fit`
        or `predict`), taken from `as_batch(x)`; a subclass whose raw input
        holds values shared by all examples overrides this."""
        return take(self.as_batch(x), indices)

    def with_labels(self, features, y=None, sample_weight=None):
        """`features`, or `(features, y)` / `(features, y, sample_weight)`
        as Keras takes them, with `y` and `sample_weight` (passed on as
        given) checked to hold one entry per example of `features` (a dict
        of arrays)."""
        if y is None and sample_weight is None:
            return features
        batch = len(next(iter(features.values())))
        for name, values in (("y", y), ("sample_weight", sample_weight)):
            if values is not None:
                check_per_example(name, values, batch)
        return keras.utils.pack_x_y_sample_weight(features, y, sample_weight)

    def get_config(self):
        """Constructor arguments except the tokenizer (saved on its own)."""
        return {}

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    @classmethod
    def _build(cls, tokenizer, config):
        """`cls` from the settings it accepts (and its tokenizer, if it has one)."""
        parameters = inspect.signature(cls.__init__).parameters
        accepted = {key: value for key, value in config.items() if key in parameters}
        if cls.tokenizer_cls is None:
            return cls(**accepted)
        return cls(tokenizer=tokenizer, **accepted)

    @classmethod
    def from_preset(cls, preset, force_download=False, **kwargs):
        """The preprocessor of a preset (its tokenizer and settings).

        Args:
            preset: str, pathlib.Path or PresetLoader. A named preset,
                `"hf://org/repo[@rev]"`, a directory, or the `PresetLoader`
                a model's `from_preset` already opened.
            force_download: bool. Download hub files again even if they are
                cached.
            **kwargs: Overrides, e.g. `sequence_length=128`; each must be an
                argument of this class.

        Settings saved by a sibling preprocessor class of the same family
        (say a classifier's, loaded for masked-LM pretraining) are reused
        where this class accepts them; a setting no class takes is an error.
        """
        check_arguments(cls, kwargs, f"{cls.__name__}.from_preset", also_known=("force_download",))
        loader = get_preset_loader(preset, family=cls.family, force_download=force_download)
        tokenizer = loader.tokenizer(cls.tokenizer_cls) if cls.tokenizer_cls is not None else None
        return cls._build(tokenizer, {**loader.preprocessor_settings(cls), **kwargs})

    def save_to_preset(self, directory):
        """Writes `preprocessor.json` (and its tokenizer's files, such as
        `tokenizer.json`, if it has a tokenizer) into `directory`.

        The files are written beside each other in a temporary folder first and
        then moved in, so a failure leaves the directory as it was.
        """
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=directory, prefix=".preprocessor.") as staging:
            write_preprocessor_files(self, Path(staging))
            for path in Path(staging).iterdir():
                os.replace(path, directory / path.name)


def read_preprocessor_files(directory, model):
    """The preprocessor of `model` whose files `write_preprocessor_files`
    wrote into `directory` (`preprocessor.json`, naming its class, and its
    tokenizer's files): a task's preprocessor in a `.keras` archive's assets.

    Raises:
        PresetFileError: the files are missing or unreadable, or name a
            registered class that is not a preprocessor.
        UnregisteredClassError: they name a class this library did not register.
    """
    source = PresetSource.of(str(directory))
    where = f"{PREPROCESSOR_FILE} of '{source.description}'"
    data = source.json(PREPROCESSOR_FILE)
    saved_cls = registered_class(data.get("class_name") if isinstance(data, dict) else None, source=where)
    if not (isinstance(saved_cls, type) and issubclass(saved_cls, Preprocessor)):
        raise PresetFileError(f"{where} names {saved_cls.__name__}, which is not a preprocessor.")
    # A native preset of `model` whose files are the preprocessor's alone.
    return saved_cls.from_preset(NativePresetLoader(source, serialize(model)))
