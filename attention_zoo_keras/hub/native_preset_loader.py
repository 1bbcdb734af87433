"""`NativePresetLoader`: a preset written by this library (`save_to_preset`).

Its `config.json` names a registered class and its arguments; the weights
are this library's own keys, so they load as they are (adapted by the
family's converter where the backbone's settings differ from the preset's).

A backbone preset may also carry task heads (`heads/<TaskClassName>/...`
tensors and a `"heads"` entry in `config.json`, written by
`save_preset_with_heads`), laid out as `preset_loader` describes.
"""

import collections
import collections.abc

from attention_zoo_keras.hub.preset_format import HEAD_PREPROCESSOR_KEY
from attention_zoo_keras.hub.preset_format import HEADS_KEY
from attention_zoo_keras.hub.preset_format import PREPROCESSOR_FILE
from attention_zoo_keras.hub.preset_loader_base import PresetLoader
from attention_zoo_keras.hub.preset_loader_base import short_listing
from attention_zoo_keras.hub.quantized_presets import rebased_dtype
from attention_zoo_keras.hub.source import PresetFileError
from attention_zoo_keras.hub.weights import CheckpointMismatchError
from attention_zoo_keras.hub.weights import variables_by_key
from attention_zoo_keras.registration import check_arguments
from attention_zoo_keras.registration import registered_class
from attention_zoo_keras.registration import unknown_names

HEADS_PREFIX = HEADS_KEY + "/"
# The top-level keys of a native `config.json`.
NATIVE_CONFIG_KEYS = ("library", "library_version", "class_name", "registered_name", "config", HEADS_KEY)
# Task arguments that are not part of a saved head's settings.
NOT_HEAD_ARGUMENTS = ("backbone", "preprocessor", "name", "trainable")


class RenamedArrays(collections.abc.Mapping):
    """`{our key: arrays[their key]}` for `names = {our key: their key}`,
    read lazily."""

    def __init__(self, arrays, names):
        self._arrays = arrays
        self._names = names

    def __getitem__(self, key):
        return self._arrays[self._names[key]]

    def __contains__(self, key):  # without reading the tensor
        return key in self._names and self._names[key] in self._arrays

    def __iter__(self):
        return iter(self._names)

    def __len__(self):
        return len(self._names)


class NativePresetLoader(PresetLoader):
    """A preset written by this library (`save_to_preset`)."""

    def __init__(self, source, config):
        super().__init__(source, config)
        where = f"config.json of '{source.description}'"
        self.saved_cls = registered_class(config.get("class_name"), source=where)
        unknown = sorted(key for key in config if key not in NATIVE_CONFIG_KEYS)
        if unknown:
            raise PresetFileError(
                f"{where} has the unknown key{'s' if len(unknown) > 1 else ''} "
                f"{unknown_names(unknown, NATIVE_CONFIG_KEYS)} Its keys are: {', '.join(NATIVE_CONFIG_KEYS)}."
            )
        if not isinstance(config.get("config"), dict):
            raise PresetFileError(f"{where} has no 'config' object.")
        nested = config["config"].get("backbone")
        self.is_task_preset = isinstance(nested, dict)
        self.backbone_data = nested if self.is_task_preset else config
        heads = config.get(HEADS_KEY, {})
        if not isinstance(heads, dict) or not all(isinstance(v, dict) for v in heads.values()):
            raise PresetFileError(f"'{HEADS_KEY}' in {where} must map task class names to their arguments.")
        for name, head in heads.items():
            registered_class(name, source=f"'{HEADS_KEY}' in {where}")
            if not isinstance(head.get(HEAD_PREPROCESSOR_KEY, {}), dict):
                raise PresetFileError(f"'{HEADS_KEY}/{name}/{HEAD_PREPROCESSOR_KEY}' in {where} must be an object.")
        self.heads = heads

    def arrays(self):
        return self.checkpoint

    def _initial_arrays(self):
        return self.checkpoint

    def _tensor_shape(self, key):
        return self.checkpoint.shape(key) if key in self.checkpoint else None

    def _provided_keys(self):
        return set(self.checkpoint.keys())

    def _backbone_arguments(self, overrides):
        where = f"config.json of '{self.description}'"
        data = self.backbone_data
        backbone_cls = registered_class(data.get("class_name"), source=where)
        saved = data.get("config")
        if not isinstance(saved, dict):
            raise PresetFileError(f"{where} has no backbone 'config' object.")
        saved = backbone_cls.upgraded_config(saved)
        check_arguments(backbone_cls, saved, where)
        arguments = {**saved, **self.source.config_overrides, **overrides}
        if "dtype" in saved and arguments["dtype"] is not saved["dtype"]:
            arguments["dtype"] = rebased_dtype(saved["dtype"], arguments["dtype"])
        return backbone_cls, arguments

    def _backbone_arrays(self, backbone):
        arrays = self._adapted(backbone, self.checkpoint)
        return RenamedArrays(arrays, {key: key for key in variables_by_key(backbone) if key in arrays})

    def _unexplained(self, keys, model):
        task_name = type(model).__name__ if hasattr(model, "backbone") else None
        backbone = getattr(model, "backbone", model)
        scopes = {key.split("/")[0] for key in variables_by_key(backbone)}
        saved_head_dropped = self.is_task_preset and self.saved_cls is not type(model)
        unexplained = set()
        for key in keys:
            if key.startswith(HEADS_PREFIX):
                head = key.split("/")[1]
                if head in self.heads and head != task_name:
                    continue  # another task's head, known and dropped
            elif saved_head_dropped and key.split("/")[0] not in scopes:
                continue  # the saved task's own head, not this model's
            unexplained.add(key)
        return unexplained

    def task_arguments(self, task_cls):
        where = f"config.json of '{self.description}'"
        if self.saved_cls is task_cls:
            arguments = {k: v for k, v in self.config["config"].items() if k not in NOT_HEAD_ARGUMENTS}
        elif task_cls.__name__ in self.heads:
            arguments = {k: v for k, v in self.heads[task_cls.__name__].items() if k != HEAD_PREPROCESSOR_KEY}
            where = f"'{HEADS_KEY}/{task_cls.__name__}' in {where}"
        else:
            return {}
        check_arguments(task_cls, arguments, where)
        return arguments

    def head_preprocessor_settings(self, task_cls):
        return dict(self.heads.get(task_cls.__name__, {}).get(HEAD_PREPROCESSOR_KEY, {}))

    def load_task_weights(self, task):
        """Fills the task's backbone and, from the preset's tensors of this
        task's class (its own task preset, or `heads/<class>/...`), its head.

        Raises:
            CheckpointMismatchError: a head this preset holds for the task
                lacks tensors, or a tensor is taken by no variable.
        """
        name = type(task).__name__
        backbone_keys = set(variables_by_key(task.backbone))
        head_keys = [key for key in variables_by_key(task) if key not in backbone_keys]
        if self.saved_cls is type(task):
            head = {key: key for key in head_keys}
            what = f"this {name} preset"
        elif name in self.heads:
            head = {key: f"{HEADS_PREFIX}{name}/{key}" for key in head_keys}
            what = f"the '{HEADS_PREFIX}{name}' head of this preset"
        else:
            head = {}
        missing = [key for key, stored in head.items() if stored not in self.checkpoint]
        if missing:
            raise CheckpointMismatchError(
                f"Preset '{self.description}' lacks tensors of {what}: {short_listing(missing)}. A "
                f"saved {name} must hold its whole head; it was not loaded with a random one."
            )
        self._refuse_unexplained(self._provided_keys() - set(head.values()) | set(head), task)
        task.assign_arrays(
            collections.ChainMap(RenamedArrays(self.checkpoint, head), self._backbone_arrays(task.backbone)),
            self.description, filled=self._filled(task.backbone),
        )

    def tokenizer(self, tokenizer_cls):
        return tokenizer_cls.from_source(self.source)

    def preprocessor_settings(self, preprocessor_cls):
        data = self.source.json(PREPROCESSOR_FILE, required=False)
        if data is None:
            return {}
        where = f"{PREPROCESSOR_FILE} of '{self.description}'"
        if not isinstance(data, dict) or not isinstance(data.get("config", {}), dict):
            raise PresetFileError(f"{where} is not a serialized preprocessor.")
        saved_cls = preprocessor_cls
        if "class_name" in data:
            saved_cls = registered_class(data["class_name"], source=where)
        settings = data.get("config", {})
        check_arguments(saved_cls, settings, where)
        # A sibling class's settings (a classifier's, loaded for masked-LM
        # pretraining) are reused where this class takes them.
        return settings

