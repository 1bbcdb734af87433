"""Quantized models that save, load and publish as presets.

`model.quantize(mode)` is Keras' own: every `Dense`, `EinsumDense` and
`Embedding` (float8: the dense layers only) keeps its weights as integers
`W_q = round(W s)` with per-output-channel scales `s` (int8, int4; int4
packs two values a byte) or as float8 with scaling factors, and computes
with `W ≈ W_q / s`. The layers' quantized dtype policies
(`"int8_from_float32"`, ...) are what a preset's config must record, since
the variables differ (`kernel` is int8, `kernel_scale` is new): a model's
`"dtype"` in its config becomes a `keras.dtype_policies.DTypePolicyMap`
from layer paths to those policies, over the model's own policy. Built from
that config, every layer creates its quantized variables directly, and the
preset's tensors fill them one for one.

A task's head takes the backbone's dtype policy, so the map a task saves
(in its backbone's config) covers the head's layers too.
"""

import contextlib
import gc
import warnings

from keras.dtype_policies import DTypePolicyMap

# Keras warns once per layer without a `quantize` method (layer norms,
# inputs, containers), and per layer without the mode (an embedding asked
# for float8): most layers, and nothing is wrong; they stay as they are.
_NOT_QUANTIZABLE_WARNINGS = (
    r"Layer .* does not have a `quantize` method implemented", r"Invalid quantization mode",
)


def _own_policy(layer):
    """The layer's dtype policy, looked up by path when it holds a map."""
    policy = layer.dtype_policy
    return policy[layer.path] if isinstance(policy, DTypePolicyMap) else policy


def quantized_layers(model):
    """The layers of `model` (nested ones too) that `quantize` quantized."""
    return [layer for layer in model._flatten_layers(include_self=False) if layer.quantization_mode is not None]


def dtype_policy_config(model, policy=None):
    """The serialized dtype policy that rebuilds `model`'s layers as they are
    now: `policy` (by default the model's own), or, once any layer is
    quantized, a `DTypePolicyMap` of the quantized layers' policies over it."""
    policy = model.dtype_policy if policy is None else policy
    base = policy.default_policy if isinstance(policy, DTypePolicyMap) else policy
    quantized = {layer.path: _own_policy(layer) for layer in quantized_layers(model)}
    if not quantized:
        return _serialized(base)
    policy_map = {path: _serialized(layer_policy) for path, layer_policy in quantized.items()}
    return {
        "module": "keras.dtype_policies", "class_name": "DTypePolicyMap",
        "config": {"default_policy": _serialized(base), "policy_map": policy_map}, "registered_name": None,
    }


def _serialized(policy):
    """`keras.dtype_policies.serialize(policy)` for a single policy, written
    directly: Keras' generic serializer imports TensorFlow (2.5 s, and under
    JAX or torch) whenever it is installed, to check for its types."""
    return {
        "module": "keras.dtype_policies", "class_name": type(policy).__name__,
        "config": policy.get_config(), "registered_name": None,
    }


@contextlib.contextmanager
def _one_garbage_collection():
    """Keras runs a full `gc.collect()` each time a layer drops a float
    variable for its quantized one: a quarter of a second each in a process
    holding torch or JAX, so minutes for a large model. Collect once, after."""
    collect = gc.collect
    gc.collect = lambda *args, **kwargs: 0
    try:
        yield
    finally:
        gc.collect = collect
        gc.collect()


class Quantizes:
    """Mixin for backbones and tasks: `quantize` that saves and reloads."""

    def quantize(self, mode=None, config=None, filters=None, **kwargs):
        """Quantizes the weights in place (Keras' `Model.quantize`).

        `save_to_preset` then writes the quantized weights and their dtype
        policies, and `from_preset` of that preset builds the quantized model
        directly; `generate`, `predict` and `evaluate` run on it. Quantize a
        task (not its backbone alone) when it has a head to quantize too.

        Args:
            mode: str or None. `"int8"`, `"int4"` or `"float8"` (dense
                layers only); see `keras.Model.quantize` for `"gptq"` /
                `"awq"`, which take a `config` with calibration data.
                `None`: the mode of `config`.
            config: keras.quantizers.QuantizationConfig or None. The
                quantization settings; `None`: the defaults of `mode`.
            filters: str, list of str, callable or None. Which layers to
                quantize: a regular expression (or list) matched against
                layer paths, or a callable; `None`: every layer that can
                be.

        Example:

        >>> lm = GPTCausalLM.from_preset("gpt2")              # doctest: +SKIP
        >>> lm.quantize("int8")                               # doctest: +SKIP
        >>> lm.save_to_preset("./gpt2_int8")                  # doctest: +SKIP
        >>> GPTCausalLM.from_preset("./gpt2_int8").generate("The attention")  # doctest: +SKIP
        """
        with warnings.catch_warnings(), _one_garbage_collection():
            for message in _NOT_QUANTIZABLE_WARNINGS:
                warnings.filterwarnings("ignore", message=message)
            super().quantize(mode, config=config, filters=filters, **kwargs)
        self._forget_compiled_functions()
