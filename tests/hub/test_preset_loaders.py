"""The loader a handle resolves to: which kind, the family converter it
finds once, the error for a `model_type` no converter reads, and how a
quantized preset's dtype is rebased."""

import json

import pytest

import attention_zoo_keras as azk
from attention_zoo_keras.hub import converters
from attention_zoo_keras.hub.native_preset_loader import NativePresetLoader
from attention_zoo_keras.hub.preset_loader import get_preset_loader
from attention_zoo_keras.hub.preset_loader_base import short_listing
from attention_zoo_keras.hub.quantized_presets import quantized_layer_paths
from attention_zoo_keras.hub.quantized_presets import quantized_tensors_hint
from attention_zoo_keras.hub.quantized_presets import rebased_dtype
from attention_zoo_keras.hub.transformers_preset_loader import TransformersPresetLoader

# Files, HTTP and error messages: the same code on every backend (scripts/test.sh runs it on torch).
pytestmark = pytest.mark.backend_independent


def test_a_transformers_checkpoint_gets_the_converter_of_its_model_type(tiny_bert_checkpoints):
    loader = get_preset_loader(str(tiny_bert_checkpoints["model"]))

    assert isinstance(loader, TransformersPresetLoader)
    assert loader.converter.model_type == "bert"
    assert loader.family_converter(azk.models.BertBackbone) is loader.converter
    assert get_preset_loader(loader) is loader


def test_a_native_preset_looks_its_family_converter_up_once(tiny_bert_checkpoints, tmp_path, monkeypatch):
    azk.models.BertBackbone.from_preset(str(tiny_bert_checkpoints["model"])).save_to_preset(tmp_path)
    loader = get_preset_loader(str(tmp_path))
    lookups = []
    monkeypatch.setattr(
        "attention_zoo_keras.hub.preset_loader_base.converter_for_backbone",
        lambda cls: lookups.append(cls) or converters.converter_for_backbone(cls),
    )

    backbone = azk.models.BertBackbone.from_preset(loader)

    assert isinstance(loader, NativePresetLoader)
    assert lookups == [type(backbone)]  # sizes checked and arrays adapted with one lookup
    assert loader.family_converter(type(backbone)).model_type == "bert"


def test_an_unknown_model_type_names_the_close_and_the_known_ones(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bret"}))

    with pytest.raises(ValueError, match=r"Unknown transformers model type 'bret'\. Did you mean: bert\?") as raised:
        get_preset_loader(str(tmp_path))

    assert "Known model types: bert, gpt2, marian, reformer, transfo-xl, vit" in str(raised.value)
    assert f"preset '{tmp_path}' is a transformers checkpoint" in str(raised.value)
    assert "cannot convert" in str(raised.value)


def test_a_converter_registers_its_model_type_once():
    with pytest.raises(ValueError, match="named 'bert' already exists"):
        converters.register_converter(converters.converter_for({"model_type": "bert"}, "test"))


def test_a_quantized_policy_map_is_rebased_on_the_requested_float_dtype():
    saved = {
        "class_name": "DTypePolicyMap",
        "config": {
            "default_policy": "float32",
            "policy_map": {
                "layer/dense": {"class_name": "QuantizedDTypePolicy", "config": {"source_name": "float32"}},
                "layer/norm": {"class_name": "DTypePolicy", "config": {"name": "float32"}},
            },
        },
    }

    rebased = rebased_dtype(saved, "bfloat16")

    assert rebased["config"]["default_policy"] == "bfloat16"
    assert rebased["config"]["policy_map"]["layer/dense"]["config"]["source_name"] == "bfloat16"
    assert rebased["config"]["policy_map"]["layer/norm"] == saved["config"]["policy_map"]["layer/norm"]
    assert rebased_dtype("float32", "bfloat16") == "bfloat16"
    assert quantized_layer_paths(None) == set() and quantized_layer_paths("float32") == set()


def test_error_listings_are_short_and_name_quantized_tensors():
    keys = [f"key_{i:02d}" for i in range(12)]

    assert short_listing(keys) == ", ".join(keys[:10]) + " ... (12 in all)"
    assert short_listing(["b", "a"]) == "a, b"
    assert "quantized model" in quantized_tensors_hint(["dense/kernel_scale"])
    assert quantized_tensors_hint(["dense/kernel"]) == ""
