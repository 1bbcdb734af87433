"""`from_preset` over `hf://` handles and named presets, through the real
`huggingface_hub` client talking to `tests.support.hub_server.LocalHub`.

Tiny `transformers` BERT checkpoints (and a tiny native preset) are published
on the local hub; what loads from the hub must compute exactly what loads from
the same files on disk, be downloaded once, work offline from the cache, honour
revisions, and fail with `PresetFileError` / `UnknownPresetError` naming what is
wrong.
"""

from __future__ import annotations

import json

import keras
import numpy as np
import pytest

import attention_zoo_keras as azk
from attention_zoo_keras.hub import PresetFileError
from attention_zoo_keras.hub import UnknownPresetError
from attention_zoo_keras.models import BertBackbone
from attention_zoo_keras.models import BertMaskedLM
from attention_zoo_keras.models import BertPreprocessor
from attention_zoo_keras.models import BertTextClassifier
from attention_zoo_keras.models import BertTextEmbedder
from attention_zoo_keras.models import BertTokenizer

# Files, HTTP and error messages: the same code on every backend (scripts/test.sh runs it on torch).
pytestmark = pytest.mark.backend_independent

BERT_BASE_REPO = "google-bert/bert-base-uncased"  # where presets/bert_base.json points
TINY_REPO = "zoo-org/tiny-bert"
TEXTS = ["the cat sat on the mat", "a very good film, but long"]


def _features(batch=2, length=8, vocabulary_size=40, seed=0):
    """BERT features with ids in range; the second row is padded."""
    rng = np.random.default_rng(seed)
    token_ids = rng.integers(5, vocabulary_size, size=(batch, length)).astype("int32")
    token_ids[:, 0] = 2  # [CLS]
    token_ids[:, -1] = 3  # [SEP]
    padding_mask = np.ones((batch, length), dtype="int32")
    padding_mask[1, -3:] = 0
    token_ids[1, -3:] = 0
    segment_ids = np.zeros((batch, length), dtype="int32")
    segment_ids[:, length // 2 :] = 1
    return {"token_ids": token_ids, "segment_ids": segment_ids, "padding_mask": padding_mask}


def _mlm_features():
    return {**_features(), "mask_positions": np.array([[1, 3], [2, 4]], dtype="int32")}


def _numpy(outputs):
    if isinstance(outputs, dict):
        return {key: keras.ops.convert_to_numpy(value) for key, value in outputs.items()}
    return keras.ops.convert_to_numpy(outputs)


def _sequence_output(backbone):
    return _numpy(backbone(_features()))["sequence_output"]


@pytest.fixture
def bert_base_on_hub(local_hub, tiny_bert_checkpoints):
    """The tiny masked-LM checkpoint published as the repo `bert_base` names."""
    local_hub.add_repo(BERT_BASE_REPO, tiny_bert_checkpoints["masked_lm"])
    return tiny_bert_checkpoints["masked_lm"]


# --- named presets and hf:// handles give what the local files give ---------


def test_named_preset_resolves_through_the_catalog_to_the_hub(local_hub, bert_base_on_hub):
    assert azk.list_presets()["bert_base"]["source"] == f"hf://{BERT_BASE_REPO}"

    from_hub = BertBackbone.from_preset("bert_base")
    from_disk = BertBackbone.from_preset(bert_base_on_hub)

    # The masked-LM checkpoint has no pooler (it keeps its random initial
    # values), so the encoder output is what both must agree on.
    np.testing.assert_allclose(_sequence_output(from_hub), _sequence_output(from_disk), atol=1e-6, rtol=0)
    assert from_hub.get_config() | {"name": None} == from_disk.get_config() | {"name": None}
    assert ("GET", f"/{BERT_BASE_REPO}/resolve/main/model.safetensors") in local_hub.requests
    snapshots = local_hub.cache_dir / "models--google-bert--bert-base-uncased" / "snapshots"
    assert {p.name for p in snapshots.glob("*/*")} >= {"config.json", "model.safetensors"}


def test_hf_handle_masked_lm_matches_the_local_directory(local_hub, bert_base_on_hub):
    from_hub = BertMaskedLM.from_preset(f"hf://{BERT_BASE_REPO}")
    from_disk = BertMaskedLM.from_preset(bert_base_on_hub)

    logits = _numpy(from_hub(_mlm_features()))
    assert logits.shape == (2, 2, from_disk.backbone.vocabulary_size)
    np.testing.assert_allclose(logits, _numpy(from_disk(_mlm_features())), atol=1e-6, rtol=0)
    # The preprocessor came from the hub repo's tokenizer files too.
    assert from_hub.preprocessor.sequence_length == from_disk.preprocessor.sequence_length == 64
    hub_ids = from_hub.preprocessor.pack(TEXTS)["token_ids"]
    np.testing.assert_array_equal(hub_ids, from_disk.preprocessor.pack(TEXTS)["token_ids"])


def test_hf_handle_backbone_with_pooler_matches_the_local_directory(local_hub, tiny_bert_checkpoints):
    local_hub.add_repo(TINY_REPO, tiny_bert_checkpoints["model"])

    from_hub = _numpy(BertBackbone.from_preset(f"hf://{TINY_REPO}")(_features()))
    from_disk = _numpy(BertBackbone.from_preset(tiny_bert_checkpoints["model"])(_features()))

    for key in ("sequence_output", "pooled_output"):
        np.testing.assert_allclose(from_hub[key], from_disk[key], atol=1e-6, rtol=0)


# --- the cache -------------------------------------------------------------


def test_second_load_downloads_nothing_again(local_hub, bert_base_on_hub):
    first = BertBackbone.from_preset("bert_base")
    assert local_hub.downloads_of("model.safetensors") == 1
    assert local_hub.downloads_of("config.json") == 1

    second = BertBackbone.from_preset("bert_base")
    third = BertBackbone.from_preset(f"hf://{BERT_BASE_REPO}")  # the same repo, by its handle

    assert local_hub.downloads_of("model.safetensors") == 1
    assert local_hub.downloads_of("config.json") == 1
    expected = _sequence_output(first)
    np.testing.assert_allclose(_sequence_output(second), expected, atol=1e-6, rtol=0)
    np.testing.assert_allclose(_sequence_output(third), expected, atol=1e-6, rtol=0)


def test_preprocessor_files_are_downloaded_once(local_hub, bert_base_on_hub):
    first = BertPreprocessor.from_preset("bert_base")
    second = BertPreprocessor.from_preset("bert_base")

    assert local_hub.downloads_of("tokenizer.json") == 1
    assert local_hub.downloads_of("config.json") == 1
    np.testing.assert_array_equal(first(TEXTS)["token_ids"], second(TEXTS)["token_ids"])


# --- offline ---------------------------------------------------------------


def test_offline_load_after_one_online_load_uses_only_the_cache(local_hub, hub_offline, bert_base_on_hub):
    online = BertTextEmbedder.from_preset("bert_base")
    expected = _numpy(online(online.preprocessor(TEXTS)))
    requests_before = len(local_hub.requests)

    hub_offline()
    offline = BertTextEmbedder.from_preset("bert_base")
    offline_backbone = BertBackbone.from_preset(f"hf://{BERT_BASE_REPO}")

    assert local_hub.requests[requests_before:] == []
    np.testing.assert_allclose(_numpy(offline(offline.preprocessor(TEXTS))), expected, atol=1e-6, rtol=0)
    np.testing.assert_allclose(
        _sequence_output(offline_backbone), _sequence_output(online.backbone), atol=1e-6, rtol=0
    )


def test_offline_load_of_a_never_downloaded_repo_raises(local_hub, hub_offline, tiny_bert_checkpoints):
    local_hub.add_repo(TINY_REPO, tiny_bert_checkpoints["model"])  # on the hub, but never downloaded
    hub_offline()

    with pytest.raises(PresetFileError, match=r"hf://zoo-org/tiny-bert.*not in the local cache.*offline") as raised:
        BertBackbone.from_preset(f"hf://{TINY_REPO}")
    assert local_hub.requests == []
    assert "download this preset once with the network (HF_HUB_OFFLINE unset)" in str(raised.value)
    assert "set HF_HUB_OFFLINE=1" not in str(raised.value)  # it is set


def test_offline_load_of_a_never_downloaded_named_preset_raises(local_hub, hub_offline, bert_base_on_hub):
    hub_offline()

    with pytest.raises(PresetFileError, match=r"google-bert/bert-base-uncased.*local cache.*offline"):
        BertBackbone.from_preset("bert_base")
    assert local_hub.requests == []


# --- revisions -------------------------------------------------------------


def test_revision_handle_loads_that_revision(local_hub, tiny_bert_checkpoints):
    # Two checkpoints of the same architecture, with different weights.
    local_hub.add_repo(TINY_REPO, tiny_bert_checkpoints["classifier"])
    local_hub.add_repo(TINY_REPO, tiny_bert_checkpoints["model"], revision="v2")

    main = _numpy(BertBackbone.from_preset(f"hf://{TINY_REPO}")(_features()))
    v2 = _numpy(BertBackbone.from_preset(f"hf://{TINY_REPO}@v2")(_features()))
    expected_v2 = _numpy(BertBackbone.from_preset(tiny_bert_checkpoints["model"])(_features()))
    expected_main = _numpy(BertBackbone.from_preset(tiny_bert_checkpoints["classifier"])(_features()))

    for key in ("sequence_output", "pooled_output"):
        np.testing.assert_allclose(v2[key], expected_v2[key], atol=1e-6, rtol=0)
        np.testing.assert_allclose(main[key], expected_main[key], atol=1e-6, rtol=0)
        assert np.abs(v2[key] - main[key]).max() > 1e-3
    assert ("GET", f"/{TINY_REPO}/resolve/v2/model.safetensors") in local_hub.requests


def test_revision_by_commit_hash(local_hub, tiny_bert_checkpoints):
    local_hub.add_repo(TINY_REPO, tiny_bert_checkpoints["model"], revision="v2")
    local_hub.add_repo(TINY_REPO, tiny_bert_checkpoints["classifier"])
    commit = local_hub.commit_hash(TINY_REPO, "v2")

    by_hash = BertBackbone.from_preset(f"hf://{TINY_REPO}@{commit}")
    expected = BertBackbone.from_preset(tiny_bert_checkpoints["model"])

    np.testing.assert_allclose(_sequence_output(by_hash), _sequence_output(expected), atol=1e-6, rtol=0)


# --- native presets on the hub --------------------------------------------


def _tiny_native_classifier():
    vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + sorted(set(" ".join(TEXTS).replace(",", " ,").split()))
    tokenizer = BertTokenizer.from_vocabulary(vocabulary)
    backbone = BertBackbone(
        vocabulary_size=len(vocabulary), num_layers=1, num_heads=2, hidden_dim=8,
        intermediate_dim=16, max_sequence_length=16,
    )
    return BertTextClassifier(backbone, num_classes=3, preprocessor=BertPreprocessor(tokenizer, sequence_length=12))


def test_native_preset_published_on_the_hub_loads_identically(local_hub, tmp_path):
    classifier = _tiny_native_classifier()
    classifier.save_to_preset(tmp_path / "native")
    local_hub.add_repo("zoo-org/native-classifier", tmp_path / "native")

    loaded = BertTextClassifier.from_preset("hf://zoo-org/native-classifier")

    assert loaded.num_classes == 3
    assert loaded.preprocessor.sequence_length == 12
    np.testing.assert_array_equal(loaded.preprocessor(TEXTS)["token_ids"], classifier.preprocessor(TEXTS)["token_ids"])
    expected = classifier.predict(TEXTS, verbose=0)
    np.testing.assert_allclose(loaded.predict(TEXTS, verbose=0), expected, atol=1e-6, rtol=0)
    # Its backbone alone loads from the same repo too.
    backbone = BertBackbone.from_preset("hf://zoo-org/native-classifier")
    np.testing.assert_allclose(
        _numpy(backbone(_features(vocabulary_size=backbone.vocabulary_size)))["pooled_output"],
        _numpy(classifier.backbone(_features(vocabulary_size=backbone.vocabulary_size)))["pooled_output"],
        atol=1e-6, rtol=0,
    )


# --- errors ----------------------------------------------------------------


def test_missing_repo_raises_naming_the_repo(local_hub):
    with pytest.raises(PresetFileError, match=r"hf://zoo-org/no-such-repo\b.*repository not found"):
        BertBackbone.from_preset("hf://zoo-org/no-such-repo")


def test_missing_revision_raises_naming_the_revision(local_hub, tiny_bert_checkpoints):
    local_hub.add_repo(TINY_REPO, tiny_bert_checkpoints["model"])

    with pytest.raises(PresetFileError, match=r"hf://zoo-org/tiny-bert@no-such-rev.*revision 'no-such-rev' does not exist"):
        BertBackbone.from_preset(f"hf://{TINY_REPO}@no-such-rev")


def test_repo_without_weights_raises_naming_the_file(local_hub, tiny_bert_checkpoints):
    config = json.loads((tiny_bert_checkpoints["model"] / "config.json").read_text())
    local_hub.add_repo(TINY_REPO, {"config.json": json.dumps(config)})

    with pytest.raises(PresetFileError, match=r"hf://zoo-org/tiny-bert.*model\.safetensors"):
        BertBackbone.from_preset(f"hf://{TINY_REPO}")


@pytest.mark.parametrize("handle", ["hf://", "hf://a/b/c", "hf:///repo", "hf://org/", "hf://@main"])
def test_malformed_hf_handle_raises_unknown_preset(local_hub, handle):
    with pytest.raises(UnknownPresetError, match="not a valid hub handle"):
        BertBackbone.from_preset(handle)
    assert local_hub.requests == []
