"""The base class of every backbone: a functional `keras.Model` that loads
itself from a preset and saves itself as one.
"""

import keras

from attention_zoo_keras.backend_support import JaxTrainerState
from attention_zoo_keras.hub.catalog import list_presets
from attention_zoo_keras.hub.preset_format import save_preset
from attention_zoo_keras.hub.preset_loader import get_preset_loader
from attention_zoo_keras.hub.weights import DEFAULT_MAX_SHARD_SIZE
from attention_zoo_keras.hub.weights import assign_weights
from attention_zoo_keras.hub.weights import variables_by_key
from attention_zoo_keras.models.exports_to_transformers import ExportsToTransformers
from attention_zoo_keras.models.validates_inputs import ValidatesInputs
from attention_zoo_keras.models.layout_maps import Distributable
from attention_zoo_keras.models.lora import LoRA
from attention_zoo_keras.models.quantization import Quantizes
from attention_zoo_keras.models.quantization import dtype_policy_config
from attention_zoo_keras.models.serving_export import ServingExport
from attention_zoo_keras.models.traced_steps import TracedSteps
from attention_zoo_keras.models.trainable_changes import FollowsTrainableChanges
from attention_zoo_keras.registration import check_arguments
from attention_zoo_keras.user_warnings import warn

# What a subclass passes on to `keras.Model.__init__` besides the user's
# `name` and `trainable`.
FUNCTIONAL_ARGUMENTS = ("inputs", "outputs")


def check_model_arguments(model, kwargs):
    """Raises for keyword arguments that reached the base class of `model`
    without any constructor taking them (`keras.Model` would ignore them),
    naming each with the closest argument `type(model)` takes."""
    unknown = {key: value for key, value in kwargs.items() if key not in FUNCTIONAL_ARGUMENTS + ("name", "trainable")}
    if unknown:
        check_arguments(type(model), unknown, f"{type(model).__name__}(...)")


class PresetsOfFamily:
    """Class attribute `presets`: the named presets a class can load."""

    def __get__(self, instance, owner):
        return list_presets(family=owner.family)


class Backbone(ValidatesInputs, FollowsTrainableChanges, TracedSteps, JaxTrainerState, Quantizes, LoRA, Distributable, ExportsToTransformers, ServingExport, keras.Model):
    """A model family's network without a task head.

    Subclasses build a functional graph in `__init__` (every layer named, so
    variable paths are stable checkpoint keys; every layer given `dtype`),
    pass `dtype` on to `Backbone.__init__`, set `family`, add their
    constructor arguments to `get_config`, and check concrete inputs in
    `validate_inputs`. `dtype` may be a `DTypePolicyMap` (a quantized
    model's, see `quantization`) and `lora` the settings of `enable_lora`;
    both are saved in the config. A keyword argument no constructor takes (a misspelt
    `dropuot=0.5`) is an error, not ignored.
    """

    family = None
    presets = PresetsOfFamily()

    def __init__(self, *args, dtype=None, lora=None, **kwargs):
        check_model_arguments(self, kwargs)
        super().__init__(*args, **kwargs)
        if dtype is not None:  # functional models ignore a `dtype` argument
            self.dtype_policy = dtype
        if lora:
            self.enable_lora(**lora)

    def get_config(self):
        config = {"name": self.name, "trainable": self.trainable, "dtype": dtype_policy_config(self)}
        if self.lora_settings is not None:
            config["lora"] = dict(self.lora_settings)
        return config

    @classmethod
    def upgraded_config(cls, config):
        """`config` as saved by an earlier version of the class, in today's
        arguments (a class whose arguments were renamed overrides this);
        `from_config` and the preset loader read configs through it.

        Args:
            config: dict. A saved `get_config()`.
        """
        return config

    @classmethod
    def from_config(cls, config):
        return cls(**cls.upgraded_config(config))

    @classmethod
    def from_preset(cls, preset, load_weights=True, force_download=False, **kwargs):
        """Builds the backbone from a preset and loads its weights.

        Loading is strict: every variable is filled, and every tensor of the
        preset is taken (or, being a task head, knowingly dropped); sizes in
        the config are checked against the weights before anything is built.

        Args:
            preset: str or pathlib.Path. A named preset (see `presets`),
                `"hf://org/repo[@rev]"`, or a local directory — in this
                library's format or a `transformers` checkpoint, converted
                on the fly.
            load_weights: bool. `False` builds the architecture only.
            force_download: bool. Download hub files again even if they are
                cached (to replace a corrupt cached file).
            **kwargs: Overrides of the config, e.g. `dtype="bfloat16"`; each
                must be an argument of the preset's backbone class.

        Example:

        >>> backbone = BertBackbone.from_preset("bert_base")   # doctest: +SKIP
        """
        loader = get_preset_loader(preset, family=cls.family, force_download=force_download)
        backbone = loader.build_backbone(cls, load_weights=load_weights, **kwargs)
        if load_weights:
            loader.load_backbone_weights(backbone)
        return backbone

    def unused_layers(self, output_names):
        """The layers whose weights none of the outputs in `output_names`
        depends on: a task that reads only those outputs does not train them
        (see `models.unused_weights`).

        The layers are those outside the part of the functional graph that
        computes the named outputs; a subclass whose layers compute several
        outputs at once (ViLBERT's co-attention) adds their unused parts.

        Args:
            output_names: iterable of str. Keys of the backbone's outputs.

        Example:

        >>> from attention_zoo_keras.models import BertBackbone
        >>> backbone = BertBackbone(vocabulary_size=30, num_layers=1, num_heads=2, hidden_dim=8,
        ...                         intermediate_dim=16, max_sequence_length=16)
        >>> [layer.name for layer in backbone.unused_layers(["sequence_output"])]
        ['pooler']
        """
        output_names = list(output_names)
        unknown = [name for name in output_names if name not in self.output]
        if unknown:
            raise ValueError(f"{type(self).__name__} has no output {unknown}; its outputs: {', '.join(self.output)}.")
        reading = keras.Model(self.input, {name: self.output[name] for name in output_names}, name=f"{self.name}_part")
        used = {id(layer) for layer in reading.layers}
        return [layer for layer in self.layers if id(layer) not in used]

    def assign_arrays(self, arrays, source_description, optional_keys=(), filled=()):
        """Loads every variable from `{key: array}` (checked shapes), warning
        about optional keys the checkpoint lacked; `filled` keys already hold
        their values (see `assign_weights`)."""
        missing = assign_weights(variables_by_key(self), arrays, source_description, optional_keys, filled)
        if missing:
            warn(
                f"Checkpoint '{source_description}' has no weights for {', '.join(missing)}; "
                "they keep their initial values."
            )

    def save_to_preset(self, directory, max_shard_size=DEFAULT_MAX_SHARD_SIZE):
        """Saves config, weights, metadata and a model card to `directory`.

        The write is atomic: on failure an existing preset there is kept.
        """
        save_preset(self, directory, family=self.family, max_shard_size=max_shard_size)
