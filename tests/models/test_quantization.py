"""Quantized models (`model.quantize`, issue 21) save, load and publish as
presets exactly: for every family's task and every mode Keras has
(int8, int4, float8), `from_preset` of the saved quantized model rebuilds the
quantized layers (their policies are in the config) and gives the very same
outputs; a tied output embedding computes with the dequantized matrix;
`generate` runs on quantized weights; predict and generate see the
quantization of a model they already compiled; and a preset whose tensors do
not fit (a float config with quantized tensors, a missing scale, integers
for a float variable) is an error naming them."""

import json

import keras
import numpy as np
import pytest
from safetensors.numpy import load_file

import attention_zoo_keras as azk
from attention_zoo_keras.hub.weights import CheckpointMismatchError
from attention_zoo_keras.hub.weights import save_arrays
from tests.support.hub_server import serving
from tests.support.tiny_models import random_ids
from tests.support.tiny_models import from_preset_like
from tests.support.tiny_models import outputs_of
from tests.support.tiny_models import task_cases
from tests.support.tiny_models import tiny_gpt
from tests.support.tiny_models import weights_of

MODES = ["int8", "int4", "float8"]


def _own_policy(layer):
    policy = layer.dtype_policy
    return policy[layer.path] if isinstance(policy, keras.dtype_policies.DTypePolicyMap) else policy


def _quantized_keys(model):
    return sorted(v.path for v in model.weights if keras.backend.standardize_dtype(v.dtype) in ("int8", "uint8"))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", sorted(task_cases()))
def test_a_quantized_model_round_trips_through_a_preset_exactly(case, mode, tmp_path):
    keras.utils.set_random_seed(0)
    model, x = task_cases()[case]()
    model.quantize(mode)
    expected = outputs_of(model, x)
    model.save_to_preset(tmp_path)

    loaded = from_preset_like(model, tmp_path)

    saved, restored = weights_of(model), weights_of(loaded)
    assert sorted(restored) == sorted(saved)
    for key, value in saved.items():
        assert restored[key].dtype == value.dtype, key
        np.testing.assert_array_equal(restored[key], value, err_msg=key)
    for actual, wanted in zip(outputs_of(loaded, x), expected):
        np.testing.assert_array_equal(actual, wanted)
    if mode != "float8":
        assert _quantized_keys(loaded) and _quantized_keys(loaded) == _quantized_keys(model)


@pytest.mark.parametrize("case", ["bert_masked_lm", "gpt_causal_lm", "seq2seq_lm"])
def test_a_tied_output_embedding_computes_with_the_dequantized_matrix(case):
    """The tied heads read the quantized embedding through its own lookup:
    int8 logits stay within rounding of the float model's (the integers
    themselves, read as floats, would be off by hundreds)."""
    keras.utils.set_random_seed(0)
    model, x = task_cases()[case]()
    (full,) = [y for y in outputs_of(model, x) if y.shape[-1] == 30]
    model.quantize("int8")
    (quantized,) = [y for y in outputs_of(model, x) if y.shape[-1] == 30]
    assert np.max(np.abs(quantized - full)) < 0.1 * (1 + np.max(np.abs(full)))


def _greedy_by_full_passes(lm, prompt, steps):
    """Greedy continuation of one prompt, each token the argmax of a full
    forward pass over everything so far."""
    tokens = list(prompt)
    for _ in range(steps):
        logits = lm({"token_ids": np.array([tokens], "int32"), "padding_mask": np.ones((1, len(tokens)), "int32")})
        tokens.append(int(np.argmax(keras.ops.convert_to_numpy(logits)[0, -1])))
    return tokens


def _tiny_lm():
    keras.utils.set_random_seed(0)
    lm = azk.models.GPTCausalLM(tiny_gpt(dropout=0.0, attention_dropout=0.0))
    rng = np.random.default_rng(0)
    for variable in lm.weights:  # weights large enough that the argmax is no near-tie
        if not variable.path.endswith(("bias", "beta", "gamma")):
            variable.assign(rng.normal(0.0, 0.5, variable.shape).astype(variable.dtype))
    return lm


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_generate_runs_on_quantized_weights_even_after_a_float_generation(mode):
    lm = _tiny_lm()
    prompt = [3, 4, 5]
    lm.generate({"token_ids": np.array([prompt], "int32")}, max_new_tokens=4, stop_token_ids=None)  # compiled on floats
    x = {"token_ids": random_ids(2, 6), "padding_mask": np.ones((2, 6), "int32")}
    lm.predict(x, verbose=0)
    lm.quantize(mode)

    output = lm.generate({"token_ids": np.array([prompt], "int32")}, max_new_tokens=4, stop_token_ids=None)

    assert output["token_ids"][0, :7].tolist() == _greedy_by_full_passes(lm, prompt, 4)
    np.testing.assert_allclose(lm.predict(x, verbose=0), outputs_of(lm, x)[0], atol=1e-5)


def test_a_quantized_preset_published_to_the_hub_loads_back_exactly(tmp_path, monkeypatch):
    lm = _tiny_lm()
    lm.quantize("int8")
    lm.save_to_preset(tmp_path / "preset")
    x = {"token_ids": random_ids(2, 6), "padding_mask": np.ones((2, 6), "int32")}
    with serving(tmp_path, monkeypatch, tokens={"hf_writer": {"me"}}):
        azk.upload_preset("hf://me/tiny-int8", tmp_path / "preset", token="hf_writer")
        loaded = azk.models.GPTCausalLM.from_preset("hf://me/tiny-int8", preprocessor=None)
    np.testing.assert_array_equal(outputs_of(loaded, x)[0], outputs_of(lm, x)[0])
    assert _quantized_keys(loaded) == _quantized_keys(lm)


def _saved_quantized_lm(directory):
    lm = _tiny_lm()
    lm.quantize("int8")
    lm.save_to_preset(directory)
    return lm


def test_quantized_tensors_under_a_float_config_are_refused_by_name(tmp_path):
    """A preset whose config lost its quantized policies (as every preset
    written before they were saved): its scales are taken by no variable."""
    _saved_quantized_lm(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["config"]["backbone"]["config"]["dtype"] = "float32"
    (tmp_path / "config.json").write_text(json.dumps(config))

    with pytest.raises(CheckpointMismatchError, match=r"kernel_scale.*quantized model"):
        azk.models.GPTCausalLM.from_preset(tmp_path, preprocessor=None)


def test_a_missing_scale_is_refused_by_name(tmp_path):
    _saved_quantized_lm(tmp_path)
    arrays = load_file(tmp_path / "model.safetensors")
    del arrays["transformer_layer_0/self_attention/query/kernel_scale"]
    save_arrays(arrays, tmp_path)

    with pytest.raises(CheckpointMismatchError, match="transformer_layer_0/self_attention/query/kernel_scale"):
        azk.models.GPTCausalLM.from_preset(tmp_path, preprocessor=None)


def test_integers_for_a_float_variable_are_refused_by_name(tmp_path):
    """int8 values read into a float kernel would be silently wrong."""
    lm = _tiny_lm()
    lm.save_to_preset(tmp_path)
    arrays = load_file(tmp_path / "model.safetensors")
    key = "transformer_layer_0/self_attention/query/kernel"
    arrays[key] = np.ones(arrays[key].shape, "int8")
    save_arrays(arrays, tmp_path)

    with pytest.raises(CheckpointMismatchError, match=f"'{key}'.*float32.*int8"):
        azk.models.GPTCausalLM.from_preset(tmp_path, preprocessor=None)


def test_a_bfloat16_task_keeps_its_dtype_in_the_preset(tmp_path):
    """The task's config records its backbone's policy (the task itself has
    the default one), quantized or not."""
    keras.utils.set_random_seed(0)
    lm = azk.models.GPTCausalLM(tiny_gpt(dtype="bfloat16"))
    lm.save_to_preset(tmp_path / "bf16")
    lm.quantize("int8")
    lm.save_to_preset(tmp_path / "int8")
    assert azk.models.GPTCausalLM.from_preset(tmp_path / "bf16", preprocessor=None).backbone.compute_dtype == "bfloat16"
    quantized = azk.models.GPTCausalLM.from_preset(tmp_path / "int8", preprocessor=None)
    policies = {layer.path: layer.dtype_policy for layer in quantized._flatten_layers()}
    query = policies["transformer_layer_0/self_attention/query"]
    assert query["transformer_layer_0/self_attention/query"].name == "int8_from_bfloat16"
    assert quantized.backbone.compute_dtype == "bfloat16"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", ["bert_classifier", "gpt_causal_lm"])
def test_a_quantized_preset_loads_in_another_float_dtype(case, mode, tmp_path):
    """`from_preset(dtype="bfloat16")` of a quantized preset keeps its
    quantized layers (the same integers and scales) and computes in
    bfloat16 around them."""
    keras.utils.set_random_seed(0)
    model, x = task_cases()[case]()
    model.quantize(mode)
    expected = outputs_of(model, x)
    model.save_to_preset(tmp_path)

    loaded = type(model).from_preset(tmp_path, preprocessor=None, dtype="bfloat16")

    policies = [_own_policy(layer) for layer in loaded._flatten_layers() if layer.quantization_mode is not None]
    assert policies and all(
        policy.quantization_mode == mode and policy.name.endswith("_from_bfloat16") for policy in policies
    )
    saved = weights_of(model)
    for variable in loaded.weights:
        value = keras.ops.convert_to_numpy(variable)
        if keras.backend.standardize_dtype(variable.dtype) in ("int8", "uint8"):
            np.testing.assert_array_equal(value, saved[variable.path], err_msg=variable.path)
    for actual, wanted in zip(outputs_of(loaded, x), expected):
        np.testing.assert_allclose(np.asarray(actual, "float32"), wanted, atol=0.1, rtol=0.05)
