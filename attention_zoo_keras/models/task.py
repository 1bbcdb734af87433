"""The base class of every task: a backbone plus a head, with a default
loss and optimizer, and an attached preprocessor so `fit`, `predict` and
`evaluate` take raw inputs (strings, images).
"""

import math
from pathlib import Path

import keras
import numpy as np

from attention_zoo_keras.backend_support import JaxTrainerState
from attention_zoo_keras.hub.preset_format import PREPROCESSOR_FILE
from attention_zoo_keras.hub.preset_format import save_preset
from attention_zoo_keras.hub.preset_format import write_preprocessor_files
from attention_zoo_keras.hub.preset_loader import get_preset_loader
from attention_zoo_keras.hub.weights import DEFAULT_MAX_SHARD_SIZE
from attention_zoo_keras.hub.weights import assign_weights
from attention_zoo_keras.hub.weights import variables_by_key
from attention_zoo_keras.models.backbone import Backbone
from attention_zoo_keras.models.backbone import PresetsOfFamily
from attention_zoo_keras.models.backbone import check_model_arguments
from attention_zoo_keras.models.checked_batches import BatchCheck
from attention_zoo_keras.models.exports_to_transformers import ExportsToTransformers
from attention_zoo_keras.models.validates_inputs import ValidatesInputs
from attention_zoo_keras.models.lora import DEFAULT_TARGET_NAMES
from attention_zoo_keras.models.lora import merged_copy
from attention_zoo_keras.models.quantization import Quantizes
from attention_zoo_keras.models.quantization import dtype_policy_config
from attention_zoo_keras.models.serving_export import ServingExport
from attention_zoo_keras.models.traced_steps import TracedSteps
from attention_zoo_keras.models.unused_weights import TrainsOnlyUsedWeights
from attention_zoo_keras.models.trainable_changes import FollowsTrainableChanges
from attention_zoo_keras.models.preprocessed_batches import PreprocessedBatches
from attention_zoo_keras.models.preprocessed_batches import take
from attention_zoo_keras.models.preprocessor import read_preprocessor_files
from attention_zoo_keras.optimizers.fused_adam import FusedAdam
from attention_zoo_keras.registration import check_arguments
from attention_zoo_keras.registration import deserialize
from attention_zoo_keras.registration import serialize
from attention_zoo_keras.user_warnings import warn

DEFAULT_BATCH_SIZE = 32


def validation_split_index(count, validation_split):
    """Where Keras splits `count` examples (or tokens) for
    `validation_split`: `floor(count · (1 − validation_split))`, the last
    ones held out; `ValueError` unless `0 < validation_split < 1`."""
    if not 0.0 < validation_split < 1.0:
        raise ValueError(f"validation_split must be between 0 and 1; got {validation_split}.")
    return int(math.floor(count * (1.0 - validation_split)))


class FamilyPresets(PresetsOfFamily):
    """Class attribute `presets` of a task: its backbone family's presets."""

    def __get__(self, instance, owner):
        return super().__get__(instance, owner.backbone_cls)


class Task(TrainsOnlyUsedWeights, ValidatesInputs, FollowsTrainableChanges, TracedSteps, JaxTrainerState, Quantizes, ExportsToTransformers, ServingExport, keras.Model):
    """A backbone with a task head.

    Subclasses set `backbone_cls` and `preprocessor_cls`, build their graph
    on `backbone.input` in `__init__`, and define `default_compile_arguments`;
    one that reads only some of the backbone's outputs names them in
    `backbone_outputs`, so the weights only the others need are not trained
    (see `models.unused_weights`).
    """

    backbone_cls = Backbone
    preprocessor_cls = None
    # `from_preset` arguments that configure the backbone and the
    # preprocessor together (not the task).
    shared_preset_arguments = ()
    presets = FamilyPresets()

    def __init__(self, *args, backbone, preprocessor=None, **kwargs):
        check_model_arguments(self, kwargs)
        kwargs.pop("dtype", None)  # the head takes the backbone's dtype policy
        super().__init__(*args, **kwargs)
        self.backbone = backbone
        self.preprocessor = preprocessor
        self._reads_variables_of(backbone)
        self._find_unused_layers(backbone)

    def validate_inputs(self, inputs):
        """Checks concrete inputs; by default, the backbone's checks."""
        self.backbone.validate_inputs(inputs)

    def default_compile_arguments(self):
        """`{"optimizer", "loss", "metrics"}` used for any `"auto"` argument."""
        return {"optimizer": FusedAdam(), "loss": None, "metrics": None}

    def compile(self, optimizer="auto", loss="auto", metrics="auto", weighted_metrics="auto", **kwargs):
        """`keras.Model.compile` with this task's defaults for `"auto"` arguments."""
        defaults = self.default_compile_arguments()
        given = {"optimizer": optimizer, "loss": loss, "metrics": metrics, "weighted_metrics": weighted_metrics}
        arguments = {key: defaults.get(key) if value == "auto" else value for key, value in given.items()}
        super().compile(**arguments, **kwargs)

    def _ensure_compiled(self):
        if not self.compiled:
            self.compile()

    # --- raw inputs -------------------------------------------------------

    def _as_dataset(self, x, y, sample_weight, batch_size, shuffle):
        """Raw inputs become preprocessed batches; anything else is returned
        as is. Either way `fit` / `evaluate` / `predict` check every batch
        (`ValidatesInputs`)."""
        if self.preprocessor is not None and self.preprocessor.is_raw(x):
            batches = PreprocessedBatches(
                self.preprocessor,
                x,
                y,
                sample_weight,
                batch_size=batch_size or DEFAULT_BATCH_SIZE,
                shuffle=shuffle,
            )
            return batches, None, None, None
        return x, y, sample_weight, batch_size

    def fit(self, x=None, y=None, batch_size=None, epochs=1, sample_weight=None, shuffle=True, validation_data=None,
            validation_split=0.0, **kwargs):
        """`keras.Model.fit`, taking raw inputs when a preprocessor is attached.

        `x` may also be a stream of raw batches (a generator, a
        `keras.utils.PyDataset`, a `tf.data.Dataset` of strings, a torch
        `DataLoader`), each preprocessed as it arrives; so may
        `validation_data`, or it may be raw arrays: `(texts, labels)` (with sample
        weights as a third item, if any), or raw inputs that hold their own
        labels (a seq2seq task's `(sources, targets)`). `validation_split`
        works on raw inputs as Keras' does on arrays: the last fraction of the
        examples (before any shuffling) is held out for validation.
        """
        self._require_inputs("fit", x)
        self._ensure_compiled()
        if validation_split and validation_data is None and self._is_raw(x):
            (x, y, sample_weight), validation_data = self._split_off_validation(x, y, sample_weight, validation_split)
            validation_split = 0.0
        x, y, sample_weight, batch_size = self._as_dataset(x, y, sample_weight, batch_size, shuffle)
        if isinstance(x, PreprocessedBatches):
            shuffle = False  # the batches shuffle themselves, every epoch
        if self._is_raw(validation_data):
            validation_data, _, _, _ = self._as_dataset(validation_data, None, None, batch_size, False)
        elif isinstance(validation_data, tuple) and self._is_raw(validation_data[0]):
            validation_x, validation_y, validation_weight = (tuple(validation_data) + (None, None))[:3]
            validation_data, _, _, _ = self._as_dataset(validation_x, validation_y, validation_weight, batch_size, False)
        return super().fit(
            x, y, batch_size=batch_size, epochs=epochs, sample_weight=sample_weight,
            shuffle=shuffle, validation_data=validation_data, validation_split=validation_split, **kwargs
        )

    def _is_raw(self, x):
        return self.preprocessor is not None and self.preprocessor.is_raw(x)

    def _batch_check(self):
        """Each batch of a generator or dataset is preprocessed first when it
        is raw (texts, images: `_preprocessed_if_raw`), then checked."""
        if self.preprocessor is None:
            return super()._batch_check()
        return BatchCheck(self.validate_batch, self._preprocessed_if_raw, widths_vary=self.preprocessor.widths_vary)

    def _preprocessed_if_raw(self, batch):
        """`batch` (`x`, `(x, y)` or `(x, y, sample_weight)`) with raw `x`
        made features by the preprocessor (as a tuple: `(x,)` or `(x, y[,
        sample_weight])`); a batch of features as it is. A whole batch that
        is raw input (a text pair, a seq2seq task's `(sources, targets)`) is
        raw `x`."""
        if self._is_raw(batch):
            prepared = self.preprocessor(batch)
        elif isinstance(batch, (tuple, list)) and 1 <= len(batch) <= 3 and self._is_raw(batch[0]):
            x, *labels_and_weights = batch  # lists of labels as arrays: a list `y` would be several outputs' labels
            prepared = self.preprocessor(x, *(np.asarray(v) if isinstance(v, list) else v for v in labels_and_weights))
        else:
            return batch
        return prepared if isinstance(prepared, tuple) else (prepared,)  # Keras takes a generator's `x` as `(x,)`

    def _split_off_validation(self, x, y, sample_weight, validation_split):
        """`((x, y, sample_weight) to train on, validation data)`: raw `x`
        (and `y`, `sample_weight`) split where Keras splits arrays, the last
        `validation_split` of the examples held out."""
        count = self.preprocessor.num_examples(x)
        split_at = validation_split_index(count, validation_split)
        if split_at in (0, count):
            raise ValueError(
                f"The raw training data holds {count} examples, too few to hold out validation_split="
                f"{validation_split} of them for validation and keep the rest for training."
            )
        parts = []
        for indices in (range(split_at), range(split_at, count)):
            parts.append((self.preprocessor.examples(x, indices), take(y, indices), take(sample_weight, indices)))
        training, (validation_x, validation_y, validation_weight) = parts
        if validation_y is None and validation_weight is None:  # raw inputs that hold their labels
            return training, validation_x
        return training, (validation_x, validation_y) if validation_weight is None else parts[1]

    def evaluate(self, x=None, y=None, batch_size=None, sample_weight=None, **kwargs):
        """`keras.Model.evaluate`, taking raw inputs (or streams of raw batches) when a preprocessor is attached."""
        self._require_inputs("evaluate", x)
        self._ensure_compiled()
        x, y, sample_weight, batch_size = self._as_dataset(x, y, sample_weight, batch_size, False)
        return super().evaluate(x, y, batch_size=batch_size, sample_weight=sample_weight, **kwargs)

    def predict(self, x, batch_size=None, **kwargs):
        """`keras.Model.predict`, taking raw inputs (or streams of raw batches) when a preprocessor is attached.

        Raw texts whose batches would be padded to different widths are all
        padded to the widest batch's width (found by preprocessing them once
        first), so per-token outputs (a language model's logits) are one
        array on every backend.
        """
        self._require_inputs("predict", x)
        x, _, _, batch_size = self._as_dataset(x, None, None, batch_size, False)
        if isinstance(x, PreprocessedBatches) and x.widths_vary and hasattr(self.preprocessor, "padded_to"):
            with self.preprocessor.padded_to(x.widest()):
                return super().predict(x, batch_size=batch_size, **kwargs)
        return super().predict(x, batch_size=batch_size, **kwargs)

    # --- config and presets ----------------------------------------------

    def get_config(self):
        backbone = serialize(self.backbone)
        # The head takes the backbone's dtype policy: a quantized head's
        # layers are recorded in the backbone's policy map.
        backbone["config"]["dtype"] = dtype_policy_config(self, self.backbone.dtype_policy)
        return {"backbone": backbone, "name": self.name, "trainable": self.trainable}

    # --- Keras' own format (`model.save("model.keras")`, `ModelCheckpoint`) ---

    def compile_from_config(self, config):
        """Restores the `compile()` arguments a `.keras` file holds when
        `keras.saving.load_model` reads it (Keras' own method skips any model
        that overrides `compile`), and builds the optimizer so that its saved
        state (step count, moments) loads too."""
        self.compile(**keras.saving.deserialize_keras_object(config))
        if self.built:
            self.optimizer.build(self.trainable_variables)

    def save_assets(self, dir_path):
        """Keeps the preprocessor in a `.keras` file: its files
        (`preprocessor.json`, the tokenizer's) go into the archive's assets,
        so that the loaded task takes raw inputs as this one does."""
        if self.preprocessor is not None:
            write_preprocessor_files(self.preprocessor, Path(dir_path))

    def load_assets(self, dir_path):
        """Attaches the preprocessor `save_assets` wrote, if there is one."""
        if (Path(dir_path) / PREPROCESSOR_FILE).is_file():
            self.preprocessor = read_preprocessor_files(dir_path, self)

    # --- adaptation --------------------------------------------------------

    def enable_lora(self, rank, target_names=DEFAULT_TARGET_NAMES, lora_alpha=None):
        """`backbone.enable_lora(...)`: LoRA on the backbone's layers named
        `target_names`, every other backbone weight frozen; the head stays
        trainable. See `Backbone.enable_lora`."""
        self.backbone.enable_lora(rank, target_names=target_names, lora_alpha=lora_alpha)

    def merge_lora(self):
        """A copy of this task (same preprocessor) whose backbone has every
        LoRA update merged into its weights and no LoRA layers."""
        return merged_copy(self)

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if isinstance(config.get("backbone"), dict):
            config["backbone"] = deserialize(config["backbone"], expected_base=Backbone)
        return cls(**config)

    @classmethod
    def from_preset(cls, preset, load_weights=True, preprocessor="auto", force_download=False, **kwargs):
        """Builds the task from a preset: its backbone, its head where the
        preset has one, and its preprocessor.

        Args:
            preset: str or pathlib.Path. A named preset,
                `"hf://org/repo[@rev]"` or a local directory (this library's
                format or `transformers`').
            load_weights: bool. `False` builds the architecture only.
            preprocessor: str, Preprocessor or None. `"auto"` builds it from
                the preset; `None` attaches none; or pass one.
            force_download: bool. Download hub files again even if they are
                cached (to replace a corrupt cached file).
            **kwargs: Task arguments (e.g. `num_classes=2`); `dtype` is also
                passed to the backbone, and the names in
                `shared_preset_arguments` (e.g. a ViT's `image_size`) go to
                the backbone and the preprocessor only. A name the task does
                not take is an error.

        The head is loaded from a preset of this task (or from the head a
        backbone preset carries for this class, see `save_preset_with_heads`);
        a native preset of this task that lacks head tensors is an error. A
        head the preset has none for (a classifier on a pretrained encoder),
        or whose shapes the arguments changed, starts from its initializer,
        with a warning naming its variables.
        """
        check_arguments(
            cls, kwargs, f"{cls.__name__}.from_preset",
            also_known=("load_weights", "preprocessor", "force_download", *cls.shared_preset_arguments),
        )
        loader = get_preset_loader(preset, family=cls.backbone_cls.family, force_download=force_download)
        shared = {key: kwargs.pop(key) for key in cls.shared_preset_arguments if key in kwargs}
        backbone_overrides = {"dtype": kwargs.pop("dtype")} if "dtype" in kwargs else {}
        backbone = loader.build_backbone(
            cls.backbone_cls, caller=f"{cls.__name__}.from_preset", load_weights=load_weights,
            **backbone_overrides, **shared,
        )
        if preprocessor == "auto":
            preprocessor = (
                cls.preprocessor_cls.from_preset(loader, **loader.head_preprocessor_settings(cls), **shared)
                if cls.preprocessor_cls else None
            )
        arguments = {**loader.task_arguments(cls), **kwargs}
        task = cls(backbone=backbone, preprocessor=preprocessor, **arguments)
        if load_weights:
            loader.load_task_weights(task)
        return task

    def assign_arrays(self, arrays, source_description, optional_keys=(), filled=()):
        """Loads the backbone from `{key: array}` (but its `filled` keys,
        see `Backbone.assign_arrays`), and the head too when the arrays hold
        all its weights with this head's shapes; otherwise the head starts
        from its initializer, with a warning naming it."""
        self.backbone.assign_arrays(arrays, source_description, optional_keys, filled)
        backbone_keys = set(variables_by_key(self.backbone))
        head = {k: v for k, v in variables_by_key(self).items() if k not in backbone_keys}
        found = {k: v for k, v in head.items() if k in arrays}
        matching = {k: v for k, v in found.items() if tuple(arrays[k].shape) == tuple(v.shape)}
        if len(matching) == len(head):  # also a task without head variables
            assign_weights(head, arrays, source_description)
            return
        reason = (
            "its weights there do not fit this head's shapes" if found
            else "it holds no weights for this head"
        )
        warn(
            f"The {type(self).__name__} head was not loaded from '{source_description}' ({reason}); "
            f"it starts from its initializer: {', '.join(sorted(head))}."
        )

    def save_to_preset(self, directory, max_shard_size=DEFAULT_MAX_SHARD_SIZE):
        """Saves the task (config, weights, preprocessor, tokenizer, metadata,
        model card) to `directory`, atomically."""
        save_preset(
            self,
            directory,
            preprocessor=self.preprocessor,
            family=self.backbone.family,
            max_shard_size=max_shard_size,
        )
