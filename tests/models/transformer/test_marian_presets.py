"""Marian MT checkpoints through the hub: the tiny `transformers`
MarianMTModel of `tiny_marian_checkpoint`, served by `local_hub`, loads by
`hf://` handle and by named preset exactly as from its directory, and a
native re-save published on the hub loads back identically. The named
OPUS-MT presets are listed with the parameter counts of their architecture."""

import json

import keras
import numpy as np
import pytest

import attention_zoo_keras as azk
from attention_zoo_keras.hub import UnknownPresetError
from attention_zoo_keras.models import BertBackbone
from attention_zoo_keras.models.transformer import TransformerBackbone
from attention_zoo_keras.models.transformer import TransformerSeq2SeqLM
from attention_zoo_keras.models.transformer.marian_convert import MarianConverter

TINY_REPO = "Helsinki-NLP/opus-mt-tiny"
NATIVE_REPO = "zoo-org/opus-mt-tiny-native"
EN_DE_REPO = "Helsinki-NLP/opus-mt-en-de"  # where presets/transformer_opus_mt_en_de.json points
SOURCES = ["The cat.", "Where is the old bridge?"]
TARGETS = ["Die Katze.", "Wo ist die alte Brücke?"]
OPUS_MT_PRESETS = {
    "transformer_opus_mt_en_de": ("en-de", 58101, "cc-by-4.0"),
    "transformer_opus_mt_de_en": ("de-en", 58101, "apache-2.0"),
    "transformer_opus_mt_en_fr": ("en-fr", 59514, "apache-2.0"),
    "transformer_opus_mt_fr_en": ("fr-en", 59514, "apache-2.0"),
    "transformer_opus_mt_en_es": ("en-es", 65001, "apache-2.0"),
    "transformer_opus_mt_es_en": ("es-en", 65001, "apache-2.0"),
}
# The config.json every OPUS-MT pair above shares, but for its vocabulary.
OPUS_MT_CONFIG = dict(
    model_type="marian", d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8,
    decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048, max_position_embeddings=512,
    activation_function="swish", scale_embedding=True,
)


def numpy(x):
    return keras.ops.convert_to_numpy(x)


def assert_same_model(loaded, expected):
    """Identical logits, preprocessing and translations."""
    assert loaded.logits_bias and loaded.preprocessor.get_config() == expected.preprocessor.get_config()
    features, _, _ = expected.preprocessor((SOURCES, TARGETS))
    loaded_features, _, _ = loaded.preprocessor((SOURCES, TARGETS))
    for key, value in features.items():
        np.testing.assert_array_equal(loaded_features[key], value)
    np.testing.assert_array_equal(numpy(loaded(features)), numpy(expected(features)))
    assert loaded.generate(SOURCES, max_length=8) == expected.generate(SOURCES, max_length=8)


@pytest.fixture(scope="module")
def from_disk(tiny_marian_checkpoint):
    return TransformerSeq2SeqLM.from_preset(str(tiny_marian_checkpoint))


def test_hf_handle_loads_like_the_directory(local_hub, tiny_marian_checkpoint, from_disk):
    local_hub.add_repo(TINY_REPO, tiny_marian_checkpoint)

    from_hub = TransformerSeq2SeqLM.from_preset(f"hf://{TINY_REPO}")

    assert_same_model(from_hub, from_disk)
    for name in ("config.json", "model.safetensors", "source.spm", "target.spm", "vocab.json"):
        assert ("GET", f"/{TINY_REPO}/resolve/main/{name}") in local_hub.requests, name


def test_named_preset_resolves_through_the_catalog_to_the_hub(local_hub, tiny_marian_checkpoint, from_disk):
    local_hub.add_repo(EN_DE_REPO, tiny_marian_checkpoint)  # the tiny model, where the preset points

    from_name = TransformerSeq2SeqLM.from_preset("transformer_opus_mt_en_de")

    assert_same_model(from_name, from_disk)
    assert ("GET", f"/{EN_DE_REPO}/resolve/main/model.safetensors") in local_hub.requests
    backbone = TransformerBackbone.from_preset("transformer_opus_mt_en_de")
    assert backbone.get_config() | {"name": None} == from_disk.backbone.get_config() | {"name": None}
    assert local_hub.downloads_of("model.safetensors") == 1  # the second load came from the cache
    with pytest.raises(UnknownPresetError, match="'transformer_opus_mt_en_de' is a transformer model, not bert"):
        BertBackbone.from_preset("transformer_opus_mt_en_de")


def test_native_resave_round_trips_through_the_hub(local_hub, tiny_marian_checkpoint, tmp_path):
    local_hub.add_repo(TINY_REPO, tiny_marian_checkpoint)
    converted = TransformerSeq2SeqLM.from_preset(f"hf://{TINY_REPO}")
    converted.save_to_preset(tmp_path / "native")
    config = json.loads((tmp_path / "native" / "config.json").read_text())
    assert config["class_name"] == "TransformerSeq2SeqLM" and config["config"]["logits_bias"]
    local_hub.add_repo(NATIVE_REPO, tmp_path / "native")

    reloaded = TransformerSeq2SeqLM.from_preset(f"hf://{NATIVE_REPO}")

    assert_same_model(reloaded, converted)
    for name in ("model.safetensors", "tokenizer.json", "target_tokenizer.json", "vocab.json", "preprocessor.json"):
        assert ("GET", f"/{NATIVE_REPO}/resolve/main/{name}") in local_hub.requests, name


def test_opus_mt_presets_are_listed():
    presets = TransformerSeq2SeqLM.presets
    assert set(OPUS_MT_PRESETS) <= set(presets)
    assert set(TransformerBackbone.presets) == set(presets)
    assert set(azk.list_presets(family="transformer")) == set(presets)
    for name, (pair, _, license) in OPUS_MT_PRESETS.items():
        entry = presets[name]
        assert entry["source"] == f"hf://Helsinki-NLP/opus-mt-{pair}"
        assert (entry["class_name"], entry["family"]) == ("TransformerSeq2SeqLM", "transformer")
        assert entry["license"] == license


def test_opus_mt_parameter_counts_are_the_architectures():
    """Each preset's count is that of the model its config builds: backbone,
    output layer (tied) and logits bias."""
    counts = {}
    for name, (_, vocabulary_size, _) in OPUS_MT_PRESETS.items():
        if vocabulary_size not in counts:
            config = MarianConverter().backbone_config({**OPUS_MT_CONFIG, "vocab_size": vocabulary_size})
            model = TransformerSeq2SeqLM(TransformerBackbone(**config), logits_bias=True)
            counts[vocabulary_size] = model.count_params()
        assert TransformerSeq2SeqLM.presets[name]["params"] == counts[vocabulary_size], name
    assert counts[58101] == 73_886_208 + 58101  # transformers' MarianMTModel count for opus-mt-en-de, and the bias
