"""The base class of every backbone: a functional `keras.Model` that loads
itself from a preset and saves itself as one.
"""

import logging

import keras

from attention_zoo_keras.hub.catalog import list_presets
from attention_zoo_keras.hub.converters import converter_for
from attention_zoo_keras.hub.preset_format import is_native
from attention_zoo_keras.hub.preset_format import load_arrays
from attention_zoo_keras.hub.preset_format import save_preset
from attention_zoo_keras.hub.source import PresetSource
from attention_zoo_keras.hub.weights import DEFAULT_MAX_SHARD_SIZE
from attention_zoo_keras.hub.weights import assign_weights
from attention_zoo_keras.hub.weights import variables_by_key
from attention_zoo_keras.models.input_validation import ValidatesInputs
from attention_zoo_keras.registration import deserialize
from attention_zoo_keras.registration import registered_class

logger = logging.getLogger(__name__)


class PresetsOfFamily:
    """Class attribute `presets`: the named presets a class can load."""

    def __get__(self, instance, owner):
        return list_presets(family=owner.family)


def backbone_config_of(config, source_description):
    """The serialized backbone inside a native preset's `config.json`.

    A task preset nests its backbone under `config["config"]["backbone"]`.
    """
    cls = registered_class(config.get("class_name"), source=f"config.json of '{source_description}'")
    if issubclass(cls, Backbone):
        return config
    nested = config.get("config", {}).get("backbone")
    if not isinstance(nested, dict):
        raise ValueError(f"Preset '{source_description}' holds a {cls.__name__} with no backbone.")
    return nested


class Backbone(ValidatesInputs, keras.Model):
    """A model family's network without a task head.

    Subclasses build a functional graph in `__init__` (every layer named, so
    variable paths are stable checkpoint keys; every layer given `dtype`),
    pass `dtype` on to `Backbone.__init__`, set `family`, add their
    constructor arguments to `get_config`, and check concrete inputs in
    `validate_inputs`.
    """

    family = None
    presets = PresetsOfFamily()

    def __init__(self, *args, dtype=None, **kwargs):
        super().__init__(*args, **kwargs)
        if dtype is not None:  # functional models ignore a `dtype` argument
            self.dtype_policy = dtype

    def get_config(self):
        return {
            "name": self.name,
            "trainable": self.trainable,
            "dtype": keras.dtype_policies.serialize(self.dtype_policy),
        }

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    @classmethod
    def from_preset(cls, preset, load_weights=True, **kwargs):
        """Builds the backbone from a preset and loads its weights.

        Args:
            preset: a named preset (see `presets`), `"hf://org/repo[@rev]"`, or
                a local directory — in this library's format or a
                `transformers` checkpoint, converted on the fly.
            load_weights: `False` builds the architecture only.
            **kwargs: overrides of the config, e.g. `dtype="bfloat16"`.

        Example:

        >>> backbone = BertBackbone.from_preset("bert_base")   # doctest: +SKIP
        """
        source = PresetSource.of(preset, family=cls.family)
        backbone, optional_keys = cls._build_from_source(source, **kwargs)
        if load_weights:
            backbone.assign_arrays(load_arrays(source), source.description, optional_keys)
        return backbone

    def assign_arrays(self, arrays, source_description, optional_keys=()):
        """Loads every variable from `{key: array}` (checked shapes), warning
        about optional keys the checkpoint lacked."""
        missing = assign_weights(variables_by_key(self), arrays, source_description, optional_keys)
        if missing:
            logger.warning(
                "Checkpoint '%s' has no weights for %s; they keep their initial values.",
                source_description,
                ", ".join(missing),
            )

    @classmethod
    def _build_from_source(cls, source, **kwargs):
        """The (unweighted) backbone a preset describes, and the keys its
        checkpoint may lack."""
        config = source.config()
        kwargs = {**source.config_overrides, **kwargs}
        if is_native(config):
            data = backbone_config_of(config, source.description)
            backbone = deserialize(
                data, source=f"config.json of '{source.description}'", expected_base=cls, **kwargs
            )
            return backbone, frozenset()
        converter = converter_for(config, source.description)
        if not issubclass(converter.backbone_cls, cls):
            raise TypeError(
                f"Preset '{source.description}' is a {converter.backbone_cls.__name__} "
                f"checkpoint; it cannot be loaded as a {cls.__name__}."
            )
        arguments = {**converter.backbone_config(config), **kwargs}
        return converter.backbone_cls(**arguments), converter.optional_keys

    def save_to_preset(self, directory, max_shard_size=DEFAULT_MAX_SHARD_SIZE):
        """Saves config, weights, metadata and a model card to `directory`.

        The write is atomic: on failure an existing preset there is kept.
        """
        save_preset(self, directory, family=self.family, max_shard_size=max_shard_size)
