"""One preset loader: a handle is resolved once into a loader that the
backbone, the task and the preprocessor ask for their config, their weights
and their tokenizer.

`get_preset_loader` reads the preset's `config.json` once and decides, in
this one place, whether it is a native preset (`NativePresetLoader`) or a
`transformers` checkpoint (`TransformersPresetLoader`, which finds the
family's converter once and opens the checkpoint once).

Loading is strict: every variable is filled (a converter may name optional
ones), every tensor is taken by a variable or knowingly dropped (another
task's head, a converter's `ignored_source_keys` / `head_keys`), every key of
a config file and every keyword argument is one the class takes, and the
sizes in a config are checked against the weights' headers before the model
is built. A task head that starts fresh (a classifier on a pretrained
encoder) is announced by a Python warning; a native task preset that lost its
head is an error.

A native backbone preset may carry task heads: tensors keyed
`heads/<TaskClassName>/<key of that task's head variable>` and, in
`config.json`, `"heads": {"<TaskClassName>": {task arguments}}` (written by
`save_preset_with_heads`); `<TaskClassName>.from_preset` builds the task with
those arguments and loads its head from those tensors. A head's entry may
also hold `"preprocessor": {settings}` that its preprocessor takes instead of
the shared ones (each ViLBERT head's task id).
"""

import collections.abc

import keras

from attention_zoo_keras.backend_support import initialized_from
from attention_zoo_keras.hub.converters import converter_for
from attention_zoo_keras.hub.converters import converter_for_backbone
from attention_zoo_keras.hub.converters import matches_any
from attention_zoo_keras.hub.preset_format import HEAD_PREPROCESSOR_KEY
from attention_zoo_keras.hub.preset_format import HEADS_KEY
from attention_zoo_keras.hub.preset_format import PREPROCESSOR_FILE
from attention_zoo_keras.hub.preset_format import is_native
from attention_zoo_keras.hub.source import PresetFileError
from attention_zoo_keras.hub.source import PresetSource
from attention_zoo_keras.hub.weights import Checkpoint
from attention_zoo_keras.hub.weights import CheckpointMismatchError
from attention_zoo_keras.hub.weights import TrackedArrays
from attention_zoo_keras.hub.weights import variables_by_key
from attention_zoo_keras.registration import check_arguments
from attention_zoo_keras.registration import registered_class
from attention_zoo_keras.registration import unknown_names

HEADS_PREFIX = HEADS_KEY + "/"
# The top-level keys of a native `config.json`.
NATIVE_CONFIG_KEYS = ("library", "library_version", "class_name", "registered_name", "config", HEADS_KEY)
# Task arguments that are not part of a saved head's settings.
NOT_HEAD_ARGUMENTS = ("backbone", "preprocessor", "name", "trainable")
SHOWN = 10


def get_preset_loader(preset, family=None, force_download=False):
    """The loader of `preset`: native or `transformers` format, decided once.

    Args:
        preset: a named preset, `"hf://org/repo[@revision]"`, a local
            directory, a `PresetSource` or a `PresetLoader` (returned as is).
        family: the model family a named preset must belong to, if any.
        force_download: download hub files again even if cached.

    Example:

    >>> loader = get_preset_loader("./my_bert")        # doctest: +SKIP
    >>> backbone = loader.build_backbone(BertBackbone)  # doctest: +SKIP
    >>> loader.load_backbone_weights(backbone)          # doctest: +SKIP
    """
    if isinstance(preset, PresetLoader):
        return preset
    source = PresetSource.of(preset, family=family, force_download=force_download)
    config = source.config()
    if is_native(config):
        return NativePresetLoader(source, config)
    return TransformersPresetLoader(source, config, converter_for(config, source.description))


def load_arrays(preset):
    """`{variable key: array}` of a preset, native or `transformers` format."""
    return get_preset_loader(preset).arrays()


def _listing(keys):
    keys = sorted(keys)
    return ", ".join(keys[:SHOWN]) + (f" ... ({len(keys)} in all)" if len(keys) > SHOWN else "")


def _quantized_hint(keys):
    if any(key.endswith("_scale") for key in keys):
        return (
            " The '*_scale' tensors are those of a quantized model (int8 kernels with their "
            "scales): a quantized preset is not loaded into a float model, which would compute "
            "garbage; save the model before quantizing it, and quantize after loading."
        )
    return ""


def _quantized_layer_paths(dtype):
    """The layer paths a backbone's `dtype` argument quantizes (the keys of
    a quantized model's `DTypePolicyMap`; none for a plain policy)."""
    if dtype is None:
        return set()
    policy = keras.dtype_policies.get(dtype)
    return set(policy) if isinstance(policy, keras.dtype_policies.DTypePolicyMap) else set()


def _rebased_dtype(saved, requested):
    """The dtype a backbone loads with when `from_preset(dtype=requested)`
    overrides the `saved` one: a quantized preset's saved policy map (its
    quantized layers over a float default, serialized) keeps its quantized
    layers, with `requested` as the float dtype they and the rest compute in
    (`int8_from_float32` becomes `int8_from_bfloat16`); anything else is
    replaced by `requested`."""
    if not (isinstance(saved, dict) and saved.get("class_name") == "DTypePolicyMap"):
        return requested
    requested_policy = keras.dtype_policies.get(requested)
    if isinstance(requested_policy, keras.dtype_policies.DTypePolicyMap):
        return requested
    name = requested_policy.name
    policy_map = {}
    for path, policy in saved["config"]["policy_map"].items():
        config = policy.get("config", {})
        policy_map[path] = {**policy, "config": {**config, "source_name": name}} if "source_name" in config else policy
    return {**saved, "config": {"default_policy": name, "policy_map": policy_map}}


def _adapted(backbone, arrays, description):
    """`arrays` fitted to `backbone` by its family converter's `adapt_arrays`."""
    converter = converter_for_backbone(type(backbone))
    return arrays if converter is None else converter.adapt_arrays(backbone, arrays, description)


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


class _FreshConversion(dict):
    """A converter's output made for one model: its arrays (views of the
    checkpoint's fresh reads, or arrays made by the conversion) are held by
    nothing else (see `backend_support.initialized_from`)."""

    reads_fresh_arrays = True


class PresetLoader:
    """What backbone, task and preprocessor classes ask a preset for.

    Args:
        source: the preset's `PresetSource`.
        config: its parsed `config.json`.
    """

    def __init__(self, source, config):
        self.source = source
        self.config = config
        self._filled_variables = None  # the `initialized_from` of the last backbone built

    @property
    def description(self):
        """The handle as the user wrote it, for messages."""
        return self.source.description

    # --- for subclasses ------------------------------------------------------

    def _backbone_arguments(self, overrides):
        """`(backbone class, its full arguments)` the preset gives, with
        `overrides`."""
        raise NotImplementedError

    def _tensor_shape(self, key):
        """The shape of the checkpoint tensor `key` (our key), or `None`."""
        raise NotImplementedError

    def _initial_arrays(self):
        """`{variable path: array}` that a backbone's variables may be
        created with (read lazily where the format allows)."""
        raise NotImplementedError

    def arrays(self):
        """`{variable key: array}` of every tensor the preset provides."""
        raise NotImplementedError

    def _provided_keys(self):
        """Every key (in this library's names) the preset provides."""
        raise NotImplementedError

    def _backbone_arrays(self, backbone):
        """The arrays a backbone load reads (adapted to `backbone`)."""
        raise NotImplementedError

    def _unexplained(self, keys, model):
        """The keys among `keys` (provided but taken by no variable of
        `model`) that nothing explains."""
        raise NotImplementedError

    def task_arguments(self, task_cls):
        """Arguments of `task_cls` the preset stores or implies."""
        raise NotImplementedError

    def tokenizer(self, tokenizer_cls):
        """The preset's tokenizer, as `tokenizer_cls`."""
        raise NotImplementedError

    def preprocessor_settings(self, preprocessor_cls):
        """Preprocessor arguments the preset stores or implies."""
        raise NotImplementedError

    def head_preprocessor_settings(self, task_cls):
        """Preprocessor arguments particular to the head of `task_cls` in a
        preset that carries several heads (e.g. a ViLBERT head's `task_id`);
        they override `preprocessor_settings` when that task loads."""
        return {}

    # --- building ------------------------------------------------------------

    def build_backbone(self, cls, caller=None, load_weights=True, **overrides):
        """The backbone (a subclass of `cls`) the preset describes, with
        `overrides` of its arguments.

        `overrides` are checked against the class's arguments (`caller`, such
        as `"BertBackbone.from_preset"`, is named in the error). With
        `load_weights` (`load_backbone_weights` or `load_task_weights` comes
        next), the sizes the weights fix (the family converter's
        `checkpoint_sizes`) are checked against the checkpoint's headers
        before anything is built, and each variable the preset fills is
        created holding its value rather than a random one
        (`backend_support.initialized_from`); the load then checks and
        assigns only the rest. Without, the variables are initialized as
        usual.
        """
        backbone_cls, arguments = self._backbone_arguments(overrides)
        if not issubclass(backbone_cls, cls):
            raise TypeError(
                f"Preset '{self.description}' holds a {backbone_cls.__name__}; it cannot be "
                f"loaded as a {cls.__name__}."
            )
        check_arguments(
            backbone_cls, overrides, caller or f"{cls.__name__}.from_preset",
            also_known=("load_weights", "force_download"),
        )
        if not load_weights:
            return backbone_cls.from_config(arguments)
        self._check_sizes(backbone_cls, arguments)
        with initialized_from(self._initial_arrays()) as initialization:
            backbone = backbone_cls.from_config(arguments)
        self._filled_variables = initialization
        return backbone

    def _filled(self, model):
        """The variables of `model` that `build_backbone` created holding
        their preset values (the load neither reads nor assigns them again)."""
        if self._filled_variables is None:
            return frozenset()
        filled = self._filled_variables.was_filled
        return frozenset(key for key, variable in variables_by_key(model).items() if filled(variable))

    def _check_sizes(self, backbone_cls, arguments):
        converter = converter_for_backbone(backbone_cls)
        sizes = converter.checkpoint_sizes if converter is not None else {}
        quantized = _quantized_layer_paths(arguments.get("dtype"))
        for name, (key, axis) in sizes.items():
            if name not in arguments or key.rpartition("/")[0] in quantized:
                continue  # a quantized layer's tensors have other shapes (int4 packs two values a byte)
            shape = self._tensor_shape(key)
            if shape is None or len(shape) <= axis or shape[axis] == arguments[name]:
                continue
            expected = tuple(shape[:axis]) + (arguments[name],) + tuple(shape[axis + 1 :])
            raise CheckpointMismatchError(
                f"Shape mismatch for variable '{key}': the model expects {expected} but checkpoint "
                f"'{self.description}' has {tuple(shape)}: {backbone_cls.__name__} argument '{name}' is "
                f"{arguments[name]!r}, but axis {axis} of the weights is {shape[axis]}. The config does "
                "not match the weights; nothing was built."
            )

    # --- weights -------------------------------------------------------------

    def _refuse_unexplained(self, provided, model):
        unused = self._unexplained(set(provided) - set(variables_by_key(model)), model)
        if unused:
            raise CheckpointMismatchError(
                f"Preset '{self.description}' holds {len(unused)} tensors that no variable of "
                f"{type(model).__name__} takes: {_listing(unused)}. They were not loaded, and "
                f"neither was anything else.{_quantized_hint(unused)}"
            )

    def load_backbone_weights(self, backbone):
        """Fills every variable of `backbone` from the preset (strictly)."""
        self._refuse_unexplained(self._provided_keys(), backbone)
        backbone.assign_arrays(
            self._backbone_arrays(backbone), self.description, self._optional_keys(), filled=self._filled(backbone)
        )

    def _optional_keys(self):
        return frozenset()


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
        self._checkpoint = None

    @property
    def checkpoint(self):
        """The preset's `Checkpoint`, opened once."""
        if self._checkpoint is None:
            self._checkpoint = Checkpoint(self.source)
        return self._checkpoint

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
        check_arguments(backbone_cls, saved, where)
        arguments = {**saved, **self.source.config_overrides, **overrides}
        if "dtype" in saved and arguments["dtype"] is not saved["dtype"]:
            arguments["dtype"] = _rebased_dtype(saved["dtype"], arguments["dtype"])
        return backbone_cls, arguments

    def _backbone_arrays(self, backbone):
        arrays = _adapted(backbone, self.checkpoint, self.description)
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
                f"Preset '{self.description}' lacks tensors of {what}: {_listing(missing)}. A "
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


class TransformersPresetLoader(PresetLoader):
    """A `transformers` checkpoint, converted by its family's converter.

    Args:
        source: the checkpoint's `PresetSource`.
        config: its `config.json` (with `model_type`).
        converter: the `TransformersConverter` of that `model_type`.
    """

    def __init__(self, source, config, converter):
        super().__init__(source, config)
        self.converter = converter
        self._checkpoint = None
        self._converted = None
        self._conversion_taken = False  # by a model built from `arrays()`

    @property
    def checkpoint(self):
        """The checkpoint's source tensors (`Checkpoint`), opened once."""
        if self._checkpoint is None:
            self._checkpoint = Checkpoint(self.source)
        return self._checkpoint

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
                f"dropped: {_listing(unread)}. This checkpoint is not one the converter "
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
        return _adapted(backbone, self.arrays(), self.description)

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
