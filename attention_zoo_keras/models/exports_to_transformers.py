"""`export_to_transformers`, for backbones and tasks (the mechanism is
`hub.transformers_export`)."""

from attention_zoo_keras.hub.converters import NotExportableError
from attention_zoo_keras.hub.transformers_export import export_to_transformers
from attention_zoo_keras.models.lora import merged_copy
from attention_zoo_keras.models.quantization import quantized_layers


class ExportsToTransformers:
    """Mixin for backbones and tasks: `export_to_transformers`."""

    def export_to_transformers(self, directory, include_preprocessor=True):
        """Writes this model in the `transformers` layout of its family, so
        that `transformers`' `from_pretrained(directory)` loads it and
        computes what it computes (checked to 1e-4 in this library's tests):
        `config.json`, `model.safetensors` and, for a task with a
        preprocessor, the tokenizer (or image processor) files. LoRA
        updates are merged into the exported weights. The write is atomic.

        A model of this library that `transformers` cannot express (another
        attention mechanism, a setting its config lacks, quantized weights)
        is refused with a `NotExportableError` naming the setting. Needs `torch` and
        `transformers` (for the layout); reading the export needs only
        `transformers`.

        Args:
            directory: str or pathlib.Path. Created, or replaced if it holds
                an earlier export (files a user added there are kept).
            include_preprocessor: bool. Whether a task's preprocessor is
                exported too (where it has one).

        Example:

        >>> classifier.export_to_transformers("./exported")   # doctest: +SKIP
        >>> transformers.AutoModelForSequenceClassification.from_pretrained("./exported")  # doctest: +SKIP
        """
        quantized = quantized_layers(self)
        if quantized:
            raise NotExportableError(
                f"This {type(self).__name__} is quantized ({len(quantized)} layers, e.g. '{quantized[0].path}'), and "
                "transformers' layouts hold float weights: export before quantize() (then quantize the "
                "transformers model with its own tools), or save_to_preset(), which keeps quantized weights."
            )
        backbone = getattr(self, "backbone", self)
        model = merged_copy(self) if backbone.lora_settings is not None else self
        preprocessor = getattr(self, "preprocessor", None) if include_preprocessor else None
        export_to_transformers(model, directory, preprocessor=preprocessor)
