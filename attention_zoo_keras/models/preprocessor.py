"""The base class of preprocessors: raw inputs in, model features out."""

import inspect
import os
import tempfile
from pathlib import Path

from attention_zoo_keras.hub.converters import converter_for
from attention_zoo_keras.hub.preset_format import PREPROCESSOR_FILE
from attention_zoo_keras.hub.preset_format import is_native
from attention_zoo_keras.hub.preset_format import write_preprocessor_files
from attention_zoo_keras.hub.source import PresetSource
from attention_zoo_keras.models.preprocessed_batches import take
from attention_zoo_keras.registration import registered_class


class Preprocessor:
    """Turns raw inputs into the feature dict a backbone takes.

    Called as `preprocessor(x, y=None, sample_weight=None)`, it returns what
    Keras expects from a dataset: `x`, `(x, y)` or `(x, y, sample_weight)`.
    Subclasses set `family` (and `tokenizer_cls` if they tokenize) and
    implement `__call__`, `is_raw`, `num_examples` and `get_config`.
    """

    tokenizer_cls = None
    family = None

    def __init__(self, tokenizer=None):
        self.tokenizer = tokenizer

    def is_raw(self, x):
        """Whether `x` is raw input this preprocessor should handle."""
        raise NotImplementedError

    def num_examples(self, x):
        """How many examples raw input `x` holds."""
        raise NotImplementedError

    def examples(self, x, indices):
        """The raw examples at `indices` of raw input `x` (one batch of `fit`
        or `predict`); a subclass whose raw input holds values shared by all
        examples overrides this."""
        return take(x, indices)

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
    def from_preset(cls, preset, **kwargs):
        """The preprocessor of a preset (its tokenizer and settings).

        Args:
            preset: a named preset, `"hf://org/repo[@rev]"` or a directory.
            **kwargs: overrides, e.g. `sequence_length=128`.

        Settings saved by a sibling preprocessor class of the same family
        (say a classifier's, loaded for masked-LM pretraining) are reused
        where this class accepts them.
        """
        source = PresetSource.of(preset, family=cls.family)
        config = source.config()
        if not is_native(config):
            converter = converter_for(config, source.description)
            tokenizer = converter.tokenizer(source, config) if cls.tokenizer_cls else None
            settings = converter.preprocessor_config(source, config)
            return cls._build(tokenizer, {**settings, **kwargs})
        tokenizer = cls.tokenizer_cls.from_source(source) if cls.tokenizer_cls is not None else None
        data = source.json(PREPROCESSOR_FILE, required=False) or {"config": {}}
        if "class_name" in data:
            registered_class(data["class_name"], source=f"{PREPROCESSOR_FILE} of '{source.description}'")
        return cls._build(tokenizer, {**data["config"], **kwargs})

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
