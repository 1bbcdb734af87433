"""`PresetLoader`: what backbone, task and preprocessor classes ask a preset
for, and the strict building and loading every kind of preset shares.

A backbone is built with the sizes its config fixes checked against the
weights' headers first (the family converter's `checkpoint_sizes`), its
variables created holding their preset values; loading then refuses a
tensor that no variable takes and nothing explains. The two kinds,
`NativePresetLoader` and `TransformersPresetLoader`, say where config,
arrays and tokenizer come from; `get_preset_loader` picks one.
"""

from attention_zoo_keras.backend_support import initialized_from
from attention_zoo_keras.hub.converters import converter_for_backbone
from attention_zoo_keras.hub.quantized_presets import quantized_layer_paths
from attention_zoo_keras.hub.quantized_presets import quantized_tensors_hint
from attention_zoo_keras.hub.weights import Checkpoint
from attention_zoo_keras.hub.weights import CheckpointMismatchError
from attention_zoo_keras.hub.weights import variables_by_key
from attention_zoo_keras.registration import check_arguments

# How many keys an error lists before it says how many there are in all.
SHOWN = 10


def short_listing(keys):
    """The first `SHOWN` of `keys`, sorted and comma-separated, and how many
    there are in all when that is more.

    Args:
        keys: iterable of str. Variable or tensor keys.
    """
    keys = sorted(keys)
    return ", ".join(keys[:SHOWN]) + (f" ... ({len(keys)} in all)" if len(keys) > SHOWN else "")


class PresetLoader:
    """What backbone, task and preprocessor classes ask a preset for.

    Args:
        source: PresetSource. Where the preset's files are.
        config: dict. Its parsed `config.json`.
    """

    def __init__(self, source, config):
        self.source = source
        self.config = config
        self._filled_variables = None  # the `initialized_from` of the last backbone built
        self._checkpoint = None
        self._family_converters = {}  # {backbone class: its family's converter or None}

    @property
    def description(self):
        """The handle as the user wrote it, for messages."""
        return self.source.description

    @property
    def checkpoint(self):
        """The preset's tensors (`_open_checkpoint`), opened once."""
        if self._checkpoint is None:
            self._checkpoint = self._open_checkpoint()
        return self._checkpoint

    def _open_checkpoint(self):
        """`{key: array}`-like access to the preset's tensors: its safetensors."""
        return Checkpoint(self.source)

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

    def family_converter(self, backbone_cls):
        """The converter of `backbone_cls`'s family (the sizes its weights
        fix, how a checkpoint adapts to it), or `None`; looked up once per
        loader.

        Args:
            backbone_cls: type. The backbone class built from the preset.
        """
        if backbone_cls not in self._family_converters:
            self._family_converters[backbone_cls] = converter_for_backbone(backbone_cls)
        return self._family_converters[backbone_cls]

    def _check_sizes(self, backbone_cls, arguments):
        converter = self.family_converter(backbone_cls)
        sizes = converter.checkpoint_sizes if converter is not None else {}
        quantized = quantized_layer_paths(arguments.get("dtype"))
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
                f"{type(model).__name__} takes: {short_listing(unused)}. They were not loaded, and "
                f"neither was anything else.{quantized_tensors_hint(unused)}"
            )

    def load_backbone_weights(self, backbone):
        """Fills every variable of `backbone` from the preset (strictly)."""
        self._refuse_unexplained(self._provided_keys(), backbone)
        backbone.assign_arrays(
            self._backbone_arrays(backbone), self.description, self._optional_keys(), filled=self._filled(backbone)
        )

    def _optional_keys(self):
        return frozenset()

    def _adapted(self, backbone, arrays):
        """`arrays` fitted to `backbone` by its family converter's `adapt_arrays`."""
        converter = self.family_converter(type(backbone))
        return arrays if converter is None else converter.adapt_arrays(backbone, arrays, self.description)

