"""`TransformersPresetLoader`: a Hugging Face `transformers` checkpoint (its
`config.json` has a `model_type`), converted on the fly by the family's
`TransformersConverter`: the converter is found once, the checkpoint opened
once and converted once, and every source tensor must be read by the
converter or be one it knowingly ignores.
"""

from attention_zoo_keras.hub.converters import matches_any
from attention_zoo_keras.hub.preset_loader_base import PresetLoader
from attention_zoo_keras.hub.preset_loader_base import short_listing
from attention_zoo_keras.hub.weights import CheckpointMismatchError
from attention_zoo_keras.hub.weights import TrackedArrays


class _FreshConversion(dict):
    """A converter's output made for one model: its arrays (views of the
    checkpoint's fresh reads, or arrays made by the conversion) are held by
    nothing else (see `backend_support.initialized_from`)."""

    reads_fresh_arrays = True


class TransformersPresetLoader(PresetLoader):
    """A `transformers` checkpoint, converted by its family's converter.

    Args:
        source: PresetSource. Where the checkpoint's files are.
        config: dict. Its `config.json` (with `model_type`).
        converter: TransformersConverter. The converter of that `model_type`.
    """

    def __init__(self, source, config, converter):
        super().__init__(source, config)
        self.converter = converter
        self._converted = None
        self._conversion_taken = False  # by a model built from `arrays()`

    def family_converter(self, backbone_cls):
        """The converter found for the checkpoint's `model_type`: the
        backbone built from it is that converter's `backbone_cls`."""
        return self.converter

    def arrays(self):
        """The converted `{variable key: array}`, converted once; every source
        tensor must be read by the converter or be one it knowingly ignores."""
        if self._converted is None:
            self._converted = self._convert()
        return self._converted

    def _convert(self):
        tracked = TrackedArrays(self.checkpoint)
        converted = self.converter.weights(self.config, tracked)
        unread = {
            key for key in self.checkpoint.keys()
            if key not in tracked.read and not matches_any(key, self.converter.ignored_source_keys)
        }
        if unread:
            raise CheckpointMismatchError(
                f"Checkpoint '{self.description}' holds {len(unread)} tensors the "
                f"'{self.converter.model_type}' converter does not know, so they would be "
                f"dropped: {short_listing(unread)}. This checkpoint is not one the converter "
                "reads faithfully; nothing was loaded."
            )
        return converted

    def _provided_keys(self):
        return set(self.arrays())

    def _initial_arrays(self):
        # The first model built takes the conversion's arrays (mostly views of
        # the checkpoint's fresh memory maps) as its memory; a later one gets
        # a conversion of its own.
        if self._conversion_taken:
            return _FreshConversion(self._convert())
        self._conversion_taken = True
        return _FreshConversion(self.arrays())

    def _tensor_shape(self, key):
        arrays = self.arrays()
        return tuple(arrays[key].shape) if key in arrays else None

    def _optional_keys(self):
        return self.converter.optional_keys

    def _backbone_arguments(self, overrides):
        arguments = {**self.converter.backbone_config(self.config), **self.source.config_overrides, **overrides}
        implied = self.converter.checkpoint_arguments(self.config, self.checkpoint, arguments)
        return self.converter.backbone_cls, {**arguments, **implied}

    def _backbone_arrays(self, backbone):
        return self._adapted(backbone, self.arrays())

    def _unexplained(self, keys, model):
        return {key for key in keys if not matches_any(key, self.converter.head_keys)}

    def task_arguments(self, task_cls):
        return self.converter.task_config(task_cls, self.source, self.config)

    def load_task_weights(self, task):
        """Fills the task's backbone and, where the checkpoint holds it with
        this head's shapes, its head."""
        self._refuse_unexplained(self._provided_keys(), task)
        task.assign_arrays(
            self._backbone_arrays(task.backbone), self.description, self._optional_keys(),
            filled=self._filled(task.backbone),
        )

    def tokenizer(self, tokenizer_cls):
        return self.converter.tokenizer(self.source, self.config)

    def preprocessor_settings(self, preprocessor_cls):
        return self.converter.preprocessor_config(self.source, self.config)
