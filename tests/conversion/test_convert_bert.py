"""The conversion script: `.bin` checkpoints (weights_only) to native presets."""

import pickle
import shutil
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
import torch
import transformers

import attention_zoo_keras as azk

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "conversion"))
import convert_bert  # noqa: E402
import state_dict  # noqa: E402


def test_pytorch_bin_checkpoint_converts_and_verifies(tiny_bert_checkpoints, tmp_path):
    source = tmp_path / "bin_checkpoint"
    shutil.copytree(tiny_bert_checkpoints["masked_lm"], source)
    model = transformers.BertForMaskedLM.from_pretrained(source)
    (source / "model.safetensors").unlink()
    torch.save(model.state_dict(), source / "pytorch_model.bin")

    destination = tmp_path / "native"
    assert convert_bert.main([str(source), str(destination), "--task", "masked_lm"]) == 0

    converted = azk.models.BertMaskedLM.from_preset(str(destination))
    reference = azk.models.BertMaskedLM.from_preset(str(tiny_bert_checkpoints["masked_lm"]))
    features = reference.preprocessor.pack(["the cat sat on the mat"])
    features["mask_positions"] = np.array([[1, 2, 3]], "int32")
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(converted(features)), keras.ops.convert_to_numpy(reference(features)), atol=1e-6
    )


def test_bin_loading_refuses_pickled_objects(tmp_path, tiny_bert_checkpoints):
    source = tmp_path / "malicious"
    shutil.copytree(tiny_bert_checkpoints["model"], source)
    (source / "model.safetensors").unlink()
    torch.save({"payload": Path("/")}, source / "pytorch_model.bin")
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        state_dict.read_state_dict(azk.hub.PresetSource(str(source)))
