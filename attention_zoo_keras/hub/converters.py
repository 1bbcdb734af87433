"""Converters from Hugging Face `transformers` checkpoints, by `model_type`.

A repo in `transformers` format (its `config.json` has a `model_type`) is
converted on the fly when loaded: each model family registers one converter
that translates the config, renames and reshapes the tensors to this
library's variable keys, and builds the tokenizer and preprocessor settings.

A converter is also its family's knowledge of checkpoints in general, used for
native presets too: which config sizes the weights' shapes fix
(`checkpoint_sizes`, checked before anything is allocated), and how a
checkpoint is adapted to a model built with other settings (`adapt_arrays`).
"""

import re

from attention_zoo_keras.naming import NameRegistry


class NotExportableError(ValueError):
    """A model computes something the `transformers` layout cannot hold."""


def copy_dense(arrays, ours, theirs, checkpoint, transpose=True):
    """`arrays[ours/kernel, ours/bias]` from a torch layer `theirs`.

    torch `nn.Linear` stores `(out, in)` and is transposed into a Keras kernel
    `(in, out)`; GPT-2's `Conv1D` already stores `(in, out)` (`transpose=False`).
    """
    weight = checkpoint[f"{theirs}.weight"]
    arrays[f"{ours}/kernel"] = weight.T if transpose else weight
    arrays[f"{ours}/bias"] = checkpoint[f"{theirs}.bias"]


def copy_layer_norm(arrays, ours, theirs, checkpoint):
    """`arrays[ours/gamma, ours/beta]` from a torch `LayerNorm` (very old
    checkpoints name its parameters `gamma` / `beta`)."""
    weight = f"{theirs}.weight" if f"{theirs}.weight" in checkpoint else f"{theirs}.gamma"
    bias = f"{theirs}.bias" if f"{theirs}.bias" in checkpoint else f"{theirs}.beta"
    arrays[f"{ours}/gamma"] = checkpoint[weight]
    arrays[f"{ours}/beta"] = checkpoint[bias]


class TransformersConverter:
    """What a family implements to load `transformers` checkpoints.

    Attributes:
        model_type: the `model_type` in `config.json` this converter reads.
        backbone_cls: the backbone class it builds.
        preprocessor_cls: the family's preprocessor for the backbone's tasks;
            a backbone converted into a native preset carries its files
            (tokenizer, settings), so tasks can be built from that preset.
        optional_keys: backbone variable keys a checkpoint may lack (for
            example BERT's pooler, which `BertForMaskedLM` does not have).
        ignored_source_keys: regular expressions (matched in full) of the
            source tensors `weights` knowingly leaves unread, such as
            `position_ids` buffers or a pre-training head this library does
            not compute; any other unread tensor is an error when loading.
        head_keys: regular expressions (matched in full) of converted keys
            that belong to a part the loaded model may lack (a task head, an
            optional pooler): they are dropped without error when no
            variable takes them, as a `BertForMaskedLM`'s head when loading
            a `BertBackbone`.
        checkpoint_sizes: `{backbone argument: (variable key, axis)}`: the
            argument must equal that axis of the checkpoint's tensor (e.g.
            `vocabulary_size` is axis 0 of the token embedding), checked
            from the weights' headers before the model is built.
    """

    model_type = None
    backbone_cls = None
    preprocessor_cls = None
    optional_keys = frozenset()
    ignored_source_keys = ()
    head_keys = ()
    checkpoint_sizes = {}

    def backbone_config(self, hf_config):
        """Keyword arguments of `backbone_cls` for a `transformers` config."""
        raise NotImplementedError

    def weights(self, hf_config, checkpoint):
        """`{variable key: array}` for every weight the checkpoint provides,
        backbone and task heads alike."""
        raise NotImplementedError

    def checkpoint_arguments(self, hf_config, checkpoint, arguments):
        """Backbone arguments the checkpoint's tensors imply (e.g. whether it
        holds a pooler), given the `arguments` already chosen; those win."""
        return {}

    def adapt_arrays(self, backbone, arrays, source_description):
        """`arrays` (native or converted, `{key: array}`) fitted to
        `backbone` where its settings differ from the checkpoint's (e.g. a
        ViT position grid for another image size); by default unchanged."""
        return arrays

    def task_config(self, task_cls, source, hf_config):
        """Task arguments the checkpoint implies (e.g. its number of labels)."""
        return {}

    def tokenizer(self, source, hf_config):
        """The family's tokenizer, built from the repo's tokenizer files."""
        raise NotImplementedError

    def preprocessor_config(self, source, hf_config):
        """Preprocessor arguments the repo implies (e.g. its maximum length)."""
        return {}

    # --- the way back: `export_to_transformers` (see `transformers_export`) --

    # `{our class name: transformers class name}`: the architecture a model
    # of that class (or of a subclass) is exported as; empty where
    # `transformers` has no counterpart.
    transformers_architectures = {}

    def transformers_architecture(self, model):
        """The `transformers` class name `model` is exported as.

        Args:
            model: Backbone or Task. A model of this converter's family.

        Raises:
            NotExportableError: no `transformers` class computes this model.
        """
        for cls in type(model).__mro__:
            if cls.__name__ in self.transformers_architectures:
                return self.transformers_architectures[cls.__name__]
        exportable = ", ".join(sorted(self.transformers_architectures)) or "none"
        raise NotExportableError(
            f"{type(model).__name__} has no transformers counterpart to export to "
            f"(exportable classes of this family: {exportable})."
        )

    def transformers_shapes(self, hf_config):
        """`{tensor name: shape}` of the checkpoint `transformers` saves for
        `hf_config`, for a family `transformers` no longer has; `None` (the
        default) asks `transformers` itself.

        Args:
            hf_config: dict. The exported `config.json`.
        """
        return None

    # `{backbone argument: transformers config key}`: the settings that
    # carry over unchanged, for `transformers_config`.
    transformers_names = {}

    def transformers_config(self, model):
        """The settings of `model`'s `transformers` `config.json` (without
        `model_type` and `architectures`): the inverse of `backbone_config`
        and `task_config`, which `export_to_transformers` checks by
        converting them back. By default the backbone's arguments named in
        `transformers_names`; a family adds what needs translating.

        Args:
            model: Backbone or Task. A model of this converter's family.
        """
        config = getattr(model, "backbone", model).get_config()
        return {theirs: config[ours] for ours, theirs in self.transformers_names.items()}

    def export_preprocessor(self, preprocessor, directory):
        """Writes the files from which `transformers` builds this family's
        tokenizer or image processor (`AutoTokenizer`,
        `AutoImageProcessor`) into `directory`.

        Args:
            preprocessor: Preprocessor. The task's preprocessor.
            directory: pathlib.Path. The export's staging directory.

        Raises:
            NotExportableError: where `transformers` cannot read this
                family's preprocessor from what this library keeps.
        """
        raise NotExportableError(
            f"The {self.model_type} preprocessor cannot be exported to transformers; export "
            "the model alone with export_to_transformers(directory, include_preprocessor=False)."
        )


_CONVERTERS = NameRegistry("transformers model type", "model types")


def register_converter(converter):
    """Registers a `TransformersConverter` instance under its `model_type`.

    Args:
        converter: TransformersConverter. The family's converter; its
            `model_type` can be taken only once.
    """
    _CONVERTERS.add(converter.model_type, converter)
    return converter


def converter_for_backbone(backbone_cls):
    """The registered converter of `backbone_cls`'s family, or `None`.

    Args:
        backbone_cls: type. A `Backbone` subclass.
    """
    for model_type in _CONVERTERS.names():
        converter = _CONVERTERS.get(model_type)
        if converter.backbone_cls is not None and issubclass(backbone_cls, converter.backbone_cls):
            return converter
    return None


def matches_any(key, patterns):
    """Whether `key` matches one of the regular expressions `patterns` in full."""
    return any(re.fullmatch(pattern, key) for pattern in patterns)


def converter_for(hf_config, source_description):
    """The converter for a `transformers` `config.json`.

    Args:
        hf_config: dict. The checkpoint's `config.json`.
        source_description: str. The handle as the user wrote it, for messages.

    Raises:
        ValueError: if the config has no `model_type` or no converter reads
            it (with the close and the known model types).
    """
    model_type = hf_config.get("model_type") if isinstance(hf_config, dict) else None
    if model_type is None:
        raise ValueError(
            f"config.json of preset '{source_description}' is neither an attention_zoo_keras "
            "preset nor a transformers checkpoint (it has no 'model_type')."
        )
    return _CONVERTERS.get(
        model_type,
        note=f"; preset '{source_description}' is a transformers checkpoint of that type, which "
        "attention_zoo_keras cannot convert",
    )
