"""How a quantized preset loads: which layers a backbone's `dtype` quantizes,
a saved quantized policy rebased on another float dtype, and what an error
says when quantized tensors meet a float model.

A quantized model is saved with its `DTypePolicyMap` (its quantized layers
over a float default) as its `dtype`; its quantized layers hold int8 (or
packed int4) kernels with `*_scale` tensors, so their shapes are not the
float layer's.
"""

import keras


def quantized_layer_paths(dtype):
    """The layer paths a backbone's `dtype` argument quantizes.

    Args:
        dtype: str, dict or `DTypePolicy`. A backbone's `dtype` argument
            (`None` for the default).

    Returns:
        The keys of a quantized model's `DTypePolicyMap`; none for a plain
        policy.
    """
    if dtype is None:
        return set()
    policy = keras.dtype_policies.get(dtype)
    return set(policy) if isinstance(policy, keras.dtype_policies.DTypePolicyMap) else set()


def rebased_dtype(saved, requested):
    """The dtype a backbone loads with when `from_preset(dtype=requested)`
    overrides the `saved` one.

    A quantized preset's saved policy map keeps its quantized layers, with
    `requested` as the float dtype they and the rest compute in
    (`int8_from_float32` becomes `int8_from_bfloat16`); anything else is
    replaced by `requested`.

    Args:
        saved: str or dict. The `dtype` in the preset's config (a serialized
            `DTypePolicyMap` for a quantized preset).
        requested: str, dict or `DTypePolicy`. The `dtype` asked for.
    """
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


def quantized_tensors_hint(keys):
    """What an error about the unused tensors `keys` adds when they are a
    quantized model's (`*_scale` tensors), or `""`.

    Args:
        keys: iterable of str. The keys no variable took.
    """
    if any(key.endswith("_scale") for key in keys):
        return (
            " The '*_scale' tensors are those of a quantized model (int8 kernels with their "
            "scales): a quantized preset is not loaded into a float model, which would compute "
            "garbage; save the model before quantizing it, and quantize after loading."
        )
    return ""
