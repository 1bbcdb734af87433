"""Low-rank adaptation (Hu et al., 2021, "LoRA: Low-Rank Adaptation of
Large Language Models"):

    h = x W + (α / r) x A B,    A: (d_in, r),  B: (r, d_out)

`W` is frozen; only `A` (random) and `B` (zeros, so training starts from the
pretrained model) learn, `r·(d_in + d_out)` values a layer instead of
`d_in·d_out`. Keras' `Dense`, `EinsumDense` and `Embedding` implement the
update (`enable_lora`); `LoRA` picks the layers of a backbone by name,
freezes every other weight, records the settings in the config (`"lora"`)
so a preset rebuilds the LoRA layers and fills `A` and `B` from its
tensors, and merges `W ← W + (α/r) A B` into a plain model for serving.
"""

from attention_zoo_keras.registration import unknown_names

# Every family names its attention projections `query`, `key`, `value` and
# `output`, and its feed-forward layers `intermediate` and `output`.
DEFAULT_TARGET_NAMES = ("query", "value")


def config_without_lora(config):
    """A backbone's or task's config (a task nests its backbone's) with the
    LoRA settings removed."""
    config = {key: value for key, value in config.items() if key != "lora"}
    nested = config.get("backbone")
    if isinstance(nested, dict) and isinstance(nested.get("config"), dict):
        config["backbone"] = {**nested, "config": config_without_lora(nested["config"])}
    return config


def merged_copy(model):
    """A new model of `model`'s class without LoRA layers, its weights
    `model`'s with every LoRA update merged (`W + (α/r) A B`, which Keras'
    layers write when saving their own variables; a quantized layer is
    quantized again after merging)."""
    merged = type(model).from_config(config_without_lora(model.get_config()))
    layers = {layer.path: layer for layer in merged._flatten_layers()}
    for layer in model._flatten_layers():
        store = {}
        layer.save_own_variables(store)
        layers[layer.path].load_own_variables(store)
    if getattr(model, "preprocessor", None) is not None:
        merged.preprocessor = model.preprocessor
    return merged


class LoRA:
    """Mixin for backbones: `enable_lora`, `lora_settings`, `merge_lora`."""

    @property
    def lora_settings(self):
        """`{"rank", "target_names", "lora_alpha"}` once LoRA is enabled,
        else `None` (saved in the config as `"lora"`)."""
        return self.__dict__.get("_lora_settings")

    def enable_lora(self, rank, target_names=DEFAULT_TARGET_NAMES, lora_alpha=None):
        """Adds LoRA matrices to the layers named `target_names` and freezes
        every other weight of the backbone (a task's head stays trainable).

        Args:
            rank: int. `r`, the rank of the update, positive.
            target_names: str or sequence of str. Names of the layers to
                adapt, in every block (`"query"`, `"key"`, `"value"`,
                `"output"`, `"intermediate"`, `"token_embedding"`, ...).
                `"output"` names both the attention output projection and
                the feed-forward output layer.
            lora_alpha: float or None. `α`, the update's scale numerator;
                `None`: `rank`.

        Example:

        >>> lm = GPTCausalLM.from_preset("gpt2")     # doctest: +SKIP
        >>> lm.backbone.enable_lora(4)               # doctest: +SKIP
        >>> lm.fit(texts, epochs=1)                  # only A and B learn  # doctest: +SKIP
        >>> lm.save_to_preset("./gpt2_lora")         # holds A and B  # doctest: +SKIP
        """
        if self.lora_settings is not None:
            raise ValueError(f"LoRA is already enabled on {self.name} ({self.lora_settings}); enable it once.")
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            raise ValueError(f"rank must be a positive integer; got {rank!r}.")
        if isinstance(target_names, str):
            target_names = (target_names,)
        adaptable = [
            layer for layer in self._flatten_layers(include_self=False)
            if hasattr(layer, "enable_lora") and layer.weights
        ]
        names = sorted({layer.name for layer in adaptable})
        unknown = [str(name) for name in target_names if name not in names]
        if unknown or not target_names:
            named = unknown_names(unknown, names) if unknown else "(none given)."
            raise ValueError(
                f"enable_lora: {type(self).__name__} has no layer that takes LoRA named {named} "
                f"Its layers that take LoRA are named: {', '.join(names)}."
            )
        for variable in self.weights:
            variable.trainable = False
        for layer in adaptable:
            if layer.name in target_names:
                layer.enable_lora(rank, lora_alpha=lora_alpha)
        self.__dict__["_lora_settings"] = {
            "rank": rank, "target_names": list(target_names), "lora_alpha": rank if lora_alpha is None else lora_alpha,
        }
        self._forget_compiled_functions()

    def merge_lora(self):
        """A copy of this backbone without LoRA layers, each adapted weight
        replaced by `W + (α/r) A B`: the same outputs, at the base model's
        cost. Save it with `save_to_preset` to publish a plain model."""
        return merged_copy(self)
