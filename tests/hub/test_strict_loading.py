"""Strict preset loading (issue 19 items 3, 4, 5, 6, 7, 8, 10): misspelt
names are errors, every tensor of a preset is taken by a variable (or
knowingly dropped), heads that start fresh warn, a native task preset that
lost its head is refused, heads travel inside a backbone preset, shard paths
stay in the preset, hub files can be downloaded again, no network fails fast,
and config sizes are checked against the weights before anything is built.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import warnings

import keras
import numpy as np
import pytest
from safetensors.numpy import load_file
from safetensors.numpy import save_file

import attention_zoo_keras as azk
from attention_zoo_keras.hub import PresetFileError
from attention_zoo_keras.hub import UnknownPresetError
from attention_zoo_keras.hub.preset_format import save_preset_with_heads
from attention_zoo_keras.hub.weights import CheckpointMismatchError
from attention_zoo_keras.registration import UnknownArgumentError

# Files, HTTP and error messages: the same code on every backend (scripts/test.sh runs it on torch).
pytestmark = pytest.mark.backend_independent

VOCABULARY = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat", "a", "dog"]
TEXTS = ["the cat sat on the mat", "a dog"]


def tiny_backbone():
    keras.utils.set_random_seed(3)
    return azk.models.BertBackbone(
        vocabulary_size=len(VOCABULARY), num_layers=1, num_heads=2, hidden_dim=8,
        intermediate_dim=16, max_sequence_length=12,
    )


def tiny_preprocessor():
    return azk.models.BertPreprocessor(azk.models.BertTokenizer.from_vocabulary(VOCABULARY), sequence_length=12)


def tiny_classifier(num_classes=3):
    return azk.models.BertTextClassifier(tiny_backbone(), num_classes=num_classes, preprocessor=tiny_preprocessor())


def features():
    return tiny_preprocessor()(TEXTS)


def numpy(value):
    if isinstance(value, dict):
        return {key: keras.ops.convert_to_numpy(item) for key, item in value.items()}
    return keras.ops.convert_to_numpy(value)


def rewrite_weights(directory, change):
    """Replaces `model.safetensors` of a saved preset by `change(arrays)`."""
    path = directory / "model.safetensors"
    arrays = change(dict(load_file(str(path))))
    save_file(arrays, str(path), metadata={"format": "np"})


def rewrite_json(path, change):
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


@pytest.fixture
def backbone_preset(tmp_path):
    backbone = tiny_backbone()
    backbone.save_to_preset(tmp_path / "backbone")
    tiny_preprocessor().save_to_preset(tmp_path / "backbone")
    return tmp_path / "backbone"


@pytest.fixture
def classifier_preset(tmp_path):
    classifier = tiny_classifier()
    classifier.save_to_preset(tmp_path / "classifier")
    return tmp_path / "classifier"


# --- item 3: misspelt names are errors ---------------------------------------


def test_misspelt_task_argument_of_from_preset_is_an_error(classifier_preset):
    with pytest.raises(UnknownArgumentError, match=r"'num_clases'.*Did you mean: num_classes"):
        azk.models.BertTextClassifier.from_preset(str(classifier_preset), num_clases=5)


def test_misspelt_backbone_argument_of_from_preset_is_an_error(backbone_preset):
    with pytest.raises(UnknownArgumentError, match=r"BertBackbone\.from_preset.*'dropuot'.*Did you mean: dropout"):
        azk.models.BertBackbone.from_preset(str(backbone_preset), dropuot=0.5)


def test_misspelt_force_download_is_an_error(backbone_preset):
    with pytest.raises(TypeError, match=r"'force_downlaod'.*Did you mean: force_download"):
        azk.models.BertBackbone.from_preset(str(backbone_preset), force_downlaod=True)


def test_misspelt_constructor_arguments_are_errors():
    with pytest.raises(UnknownArgumentError, match=r"'dropuot'.*Did you mean: dropout"):
        azk.models.BertBackbone(vocabulary_size=12, num_layers=1, num_heads=2, hidden_dim=8,
                                intermediate_dim=16, dropuot=0.5)
    with pytest.raises(UnknownArgumentError, match=r"'num_clases'"):
        azk.models.BertTextClassifier(tiny_backbone(), num_classes=2, num_clases=3)


def test_keras_model_arguments_stay_allowed():
    backbone = azk.models.BertBackbone(vocabulary_size=12, num_layers=1, num_heads=2, hidden_dim=8,
                                       intermediate_dim=16, name="encoder", trainable=False, dtype="float32")
    assert backbone.name == "encoder" and not backbone.trainable
    classifier = azk.models.BertTextClassifier(backbone, num_classes=2, name="clf", trainable=True)
    assert classifier.name == "clf"


def test_misspelt_preprocessor_argument_is_an_error(backbone_preset):
    with pytest.raises(UnknownArgumentError, match=r"'sequence_lenght'.*Did you mean: sequence_length"):
        azk.models.BertPreprocessor.from_preset(str(backbone_preset), sequence_lenght=5)


def test_unknown_key_in_backbone_config_json_is_an_error(backbone_preset):
    rewrite_json(backbone_preset / "config.json", lambda config: config["config"].update(dropuot=0.5))
    with pytest.raises(UnknownArgumentError, match=r"config\.json of .*'dropuot'.*Did you mean: dropout"):
        azk.models.BertBackbone.from_preset(str(backbone_preset))


def test_unknown_key_in_a_task_config_and_its_nested_backbone_is_an_error(classifier_preset):
    rewrite_json(classifier_preset / "config.json", lambda config: config["config"].update(num_clases=4))
    with pytest.raises(UnknownArgumentError, match=r"config\.json of .*'num_clases'.*num_classes"):
        azk.models.BertTextClassifier.from_preset(str(classifier_preset))
    rewrite_json(classifier_preset / "config.json", lambda config: config["config"].pop("num_clases"))
    rewrite_json(
        classifier_preset / "config.json",
        lambda config: config["config"]["backbone"]["config"].update(num_layer=2),
    )
    with pytest.raises(UnknownArgumentError, match=r"'num_layer'.*Did you mean: num_layers"):
        azk.models.BertTextClassifier.from_preset(str(classifier_preset))


def test_unknown_top_level_key_of_config_json_is_an_error(backbone_preset):
    rewrite_json(backbone_preset / "config.json", lambda config: config.update(head={}))
    with pytest.raises(PresetFileError, match=r"unknown key 'head'.*Did you mean: heads"):
        azk.models.BertBackbone.from_preset(str(backbone_preset))


def test_unknown_key_in_preprocessor_json_is_an_error(backbone_preset):
    rewrite_json(backbone_preset / "preprocessor.json", lambda data: data["config"].update(sequence_lenght=4))
    with pytest.raises(UnknownArgumentError, match=r"preprocessor\.json.*'sequence_lenght'"):
        azk.models.BertPreprocessor.from_preset(str(backbone_preset))


# --- item 3: every tensor is taken --------------------------------------------


def test_a_tensor_no_variable_takes_is_an_error(backbone_preset):
    rewrite_weights(backbone_preset, lambda arrays: {**arrays, "stray/kernel": np.zeros((2, 2), "float32")})
    with pytest.raises(CheckpointMismatchError, match=r"1 tensors that no variable of BertBackbone takes: stray/kernel"):
        azk.models.BertBackbone.from_preset(str(backbone_preset))


def test_a_source_tensor_the_converter_does_not_know_is_an_error(tiny_bert_checkpoints, tmp_path):
    directory = tmp_path / "hf"
    directory.mkdir()
    for path in tiny_bert_checkpoints["model"].iterdir():
        (directory / path.name).write_bytes(path.read_bytes())
    rewrite_weights(directory, lambda arrays: {**arrays, "encoder.adapter.weight": np.zeros((2, 2), "float32")})
    with pytest.raises(CheckpointMismatchError, match=r"'bert' converter does not know.*encoder\.adapter\.weight"):
        azk.models.BertBackbone.from_preset(str(directory))


def test_heads_the_converter_declares_are_dropped_for_a_backbone(tiny_bert_checkpoints):
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # nothing to warn about: the pooler and every layer are there
        backbone = azk.models.BertBackbone.from_preset(str(tiny_bert_checkpoints["classifier"]))
    assert backbone.count_params() > 0


# --- item 4: heads that start fresh, heads that are missing -------------------


def test_a_task_on_a_backbone_only_preset_warns_which_head_starts_fresh(backbone_preset):
    with pytest.warns(UserWarning, match=r"BertTextClassifier head.*starts from its initializer: classifier/bias, classifier/kernel") as caught:
        azk.models.BertTextClassifier.from_preset(str(backbone_preset), num_classes=2)
    # The warning names the user's line (this file), not the library's.
    assert [record.filename for record in caught] == [__file__]


def test_a_transformers_encoder_into_a_classifier_warns(tiny_bert_checkpoints):
    with pytest.warns(UserWarning, match=r"BertTextClassifier head.*classifier/kernel"):
        azk.models.BertTextClassifier.from_preset(str(tiny_bert_checkpoints["model"]), num_classes=2, preprocessor=None)


def test_a_native_task_preset_without_its_head_is_an_error(classifier_preset):
    rewrite_weights(classifier_preset, lambda arrays: {k: v for k, v in arrays.items() if not k.startswith("classifier/")})
    with pytest.raises(CheckpointMismatchError, match=r"lacks tensors of this BertTextClassifier preset: classifier/bias, classifier/kernel"):
        azk.models.BertTextClassifier.from_preset(str(classifier_preset))


def test_two_loads_of_a_task_preset_predict_the_same(classifier_preset):
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        first = azk.models.BertTextClassifier.from_preset(str(classifier_preset)).predict(TEXTS, verbose=0)
        second = azk.models.BertTextClassifier.from_preset(str(classifier_preset)).predict(TEXTS, verbose=0)
    np.testing.assert_array_equal(first, second)


# --- heads carried by a backbone preset ---------------------------------------


@pytest.fixture
def preset_with_heads(tmp_path):
    backbone = tiny_backbone()
    classifier = azk.models.BertTextClassifier(backbone, num_classes=4, dropout=0.2)
    masked_lm = azk.models.BertMaskedLM(backbone)
    for layer_variable in classifier.weights + masked_lm.weights:  # heads that differ from their initializers
        if layer_variable.path.startswith(("classifier/", "mlm_head/")):
            layer_variable.assign(np.random.default_rng(0).normal(size=layer_variable.shape).astype("float32"))
    save_preset_with_heads(backbone, [classifier, masked_lm], tmp_path / "heads", preprocessor=tiny_preprocessor())
    return tmp_path / "heads", backbone, classifier, masked_lm


def test_each_task_loads_its_head_from_a_preset_with_heads(preset_with_heads):
    directory, backbone, classifier, masked_lm = preset_with_heads
    config = json.loads((directory / "config.json").read_text())
    assert config["heads"]["BertTextClassifier"] == {"num_classes": 4, "dropout": 0.2}
    inputs = features()
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no head starts fresh, no tensor is left over
        loaded_classifier = azk.models.BertTextClassifier.from_preset(str(directory))
        loaded_masked_lm = azk.models.BertMaskedLM.from_preset(str(directory))
        loaded_backbone = azk.models.BertBackbone.from_preset(str(directory))
    assert loaded_classifier.num_classes == 4 and loaded_classifier.dropout == 0.2
    np.testing.assert_allclose(numpy(loaded_classifier(inputs)), numpy(classifier(inputs)), atol=1e-6)
    masked = {**inputs, "mask_positions": np.array([[1, 2], [1, 2]], "int32")}
    np.testing.assert_allclose(numpy(loaded_masked_lm(masked)), numpy(masked_lm(masked)), atol=1e-5)
    np.testing.assert_allclose(
        numpy(loaded_backbone(inputs))["sequence_output"], numpy(backbone(inputs))["sequence_output"], atol=1e-6
    )


def test_arguments_override_a_saved_head(preset_with_heads):
    directory = preset_with_heads[0]
    with pytest.warns(UserWarning, match=r"do not fit this head's shapes"):
        five_way = azk.models.BertTextClassifier.from_preset(str(directory), num_classes=5)
    assert five_way.num_classes == 5 and five_way.dropout == 0.2


def test_a_head_of_an_unregistered_task_is_an_error(preset_with_heads):
    directory = preset_with_heads[0]
    rewrite_weights(directory, lambda arrays: {**arrays, "heads/NoSuchTask/dense/kernel": np.zeros((1,), "float32")})
    with pytest.raises(CheckpointMismatchError, match=r"heads/NoSuchTask/dense/kernel"):
        azk.models.BertBackbone.from_preset(str(directory))


def test_a_head_tensor_no_variable_of_its_task_takes_is_an_error(preset_with_heads):
    directory = preset_with_heads[0]
    rewrite_weights(directory, lambda arrays: {**arrays, "heads/BertTextClassifier/classifier/extra": np.zeros((1,), "float32")})
    azk.models.BertMaskedLM.from_preset(str(directory))  # another task's head: known, not this task's concern
    with pytest.raises(CheckpointMismatchError, match=r"BertTextClassifier takes: heads/BertTextClassifier/classifier/extra"):
        azk.models.BertTextClassifier.from_preset(str(directory))


def test_a_missing_head_tensor_is_an_error(preset_with_heads):
    directory = preset_with_heads[0]
    rewrite_weights(directory, lambda arrays: {k: v for k, v in arrays.items() if k != "heads/BertMaskedLM/mlm_head/output_bias"})
    with pytest.raises(CheckpointMismatchError, match=r"'heads/BertMaskedLM' head of this preset: mlm_head/output_bias"):
        azk.models.BertMaskedLM.from_preset(str(directory))


def test_a_head_loads_with_its_own_preprocessor_settings(tmp_path):
    backbone = tiny_backbone()
    classifier = azk.models.BertTextClassifier(backbone, num_classes=2)
    masked_lm = azk.models.BertMaskedLM(backbone)
    save_preset_with_heads(
        backbone, [classifier, masked_lm], tmp_path / "heads", preprocessor=tiny_preprocessor(),
        head_preprocessor_settings={"BertTextClassifier": {"sequence_length": 6}},
    )
    assert azk.models.BertTextClassifier.from_preset(str(tmp_path / "heads")).preprocessor.sequence_length == 6
    assert azk.models.BertMaskedLM.from_preset(str(tmp_path / "heads")).preprocessor.sequence_length == 12
    with pytest.raises(ValueError, match="head_preprocessor_settings names tasks not saved here: BertMaskedLM"):
        save_preset_with_heads(backbone, [classifier], tmp_path / "x", head_preprocessor_settings={"BertMaskedLM": {}})
    config = json.loads((tmp_path / "heads" / "config.json").read_text())
    config["heads"]["BertTextClassifier"]["preprocessor"] = 6
    (tmp_path / "heads" / "config.json").write_text(json.dumps(config))
    with pytest.raises(PresetFileError, match="'heads/BertTextClassifier/preprocessor' in config.json .* must be an object"):
        azk.models.BertTextClassifier.from_preset(str(tmp_path / "heads"))


def test_save_preset_with_heads_refuses_a_task_on_another_backbone(tmp_path):
    with pytest.raises(ValueError, match="not built on the backbone given"):
        save_preset_with_heads(tiny_backbone(), [tiny_classifier()], tmp_path / "x")
    assert not (tmp_path / "x").exists()


# --- item 5: shard paths stay inside the preset -------------------------------


@pytest.mark.parametrize("shard", ["../outside.safetensors", "/tmp/outside.safetensors", "link.safetensors"])
def test_a_shard_outside_the_preset_is_refused(tmp_path, shard):
    preset = tmp_path / "preset"
    tiny_backbone().save_to_preset(preset, max_shard_size="1KB")
    outside = tmp_path / "outside.safetensors"
    first = sorted(preset.glob("model-*.safetensors"))[0]
    outside.write_bytes(first.read_bytes())
    (preset / "link.safetensors").symlink_to(outside)
    index = json.loads((preset / "model.safetensors.index.json").read_text())
    key = next(iter(index["weight_map"]))
    index["weight_map"][key] = shard
    (preset / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(PresetFileError, match=rf"'{key}' to the shard '{shard}', which lies outside the preset"):
        azk.models.BertBackbone.from_preset(str(preset))


def test_a_hugging_face_cache_snapshot_directory_still_loads(tmp_path):
    # In the cache, `<repo>/snapshots/<revision>/` files link to `<repo>/blobs/`.
    backbone = tiny_backbone()
    backbone.save_to_preset(tmp_path / "saved", max_shard_size="1KB")
    blobs, snapshot = tmp_path / "repo" / "blobs", tmp_path / "repo" / "snapshots" / "abc123"
    blobs.mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for number, path in enumerate(sorted((tmp_path / "saved").iterdir())):
        (blobs / f"blob{number}").write_bytes(path.read_bytes())
        (snapshot / path.name).symlink_to(f"../../blobs/blob{number}")
    loaded = azk.models.BertBackbone.from_preset(str(snapshot))
    inputs = features()
    np.testing.assert_allclose(
        numpy(loaded(inputs))["sequence_output"], numpy(backbone(inputs))["sequence_output"], atol=1e-6
    )


# --- item 10: sizes are checked before anything is built ----------------------


def test_a_huge_size_in_config_json_is_refused_before_building(backbone_preset):
    rewrite_json(backbone_preset / "config.json", lambda config: config["config"].update(vocabulary_size=2_000_000_000))
    with pytest.raises(
        CheckpointMismatchError,
        match=r"'token_embedding/embeddings'.*expects \(2000000000, 8\).*has \(12, 8\).*'vocabulary_size' is 2000000000.*nothing was built",
    ):
        azk.models.BertBackbone.from_preset(str(backbone_preset))


def test_a_huge_size_given_to_from_preset_is_refused(tiny_bert_checkpoints):
    with pytest.raises(CheckpointMismatchError, match=r"'hidden_dim' is 4096"):
        azk.models.BertBackbone.from_preset(str(tiny_bert_checkpoints["model"]), hidden_dim=4096)


# --- items 6, 7, 8: the hub ----------------------------------------------------


def test_empty_revision_is_an_error(local_hub):
    with pytest.raises(UnknownPresetError, match=r"the revision after '@' is empty"):
        azk.models.BertBackbone.from_preset("hf://zoo-org/tiny-bert@")
    assert local_hub.requests == []


def test_invalid_repo_id_is_wrapped(local_hub):
    with pytest.raises(UnknownPresetError, match="not a valid hub handle") as raised:
        azk.models.BertBackbone.from_preset("hf://zoo-org/bad name!")
    assert type(raised.value.__cause__).__name__ == "HFValidationError"


def test_force_download_downloads_again(local_hub, tmp_path):
    tiny_backbone().save_to_preset(tmp_path / "native")
    local_hub.add_repo("zoo-org/native", tmp_path / "native")
    azk.models.BertBackbone.from_preset("hf://zoo-org/native")
    azk.models.BertBackbone.from_preset("hf://zoo-org/native")
    assert local_hub.downloads_of("model.safetensors") == 1
    azk.models.BertBackbone.from_preset("hf://zoo-org/native", force_download=True)
    assert local_hub.downloads_of("model.safetensors") == 2


def test_a_corrupt_cached_file_names_its_path_and_force_download(local_hub, tmp_path):
    classifier = tiny_classifier()
    classifier.save_to_preset(tmp_path / "native")
    local_hub.add_repo("zoo-org/native", tmp_path / "native")
    azk.models.BertTextClassifier.from_preset("hf://zoo-org/native")
    cached = next(local_hub.cache_dir.rglob("model.safetensors"))
    blob = cached.resolve()
    os.chmod(blob, 0o644)
    blob.write_bytes(b"\x00garbage")
    with pytest.raises(PresetFileError, match=rf"{cached.parent}.*model\.safetensors.*force_download=True") as raised:
        azk.models.BertTextClassifier.from_preset("hf://zoo-org/native")
    assert "cached download" in str(raised.value)
    repaired = azk.models.BertTextClassifier.from_preset("hf://zoo-org/native", force_download=True)
    np.testing.assert_allclose(repaired.predict(TEXTS, verbose=0), classifier.predict(TEXTS, verbose=0), atol=1e-6)


def _closed_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_no_network_fails_at_once_saying_how_to_go_offline(local_hub, monkeypatch, caplog):
    from huggingface_hub import constants

    endpoint = f"http://127.0.0.1:{_closed_port()}"
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", endpoint + "/{repo_id}/resolve/{revision}/{filename}")
    with caplog.at_level(logging.WARNING), pytest.raises(PresetFileError) as raised:
        azk.models.BertBackbone.from_preset("hf://zoo-org/never-downloaded")
    message = str(raised.value)
    assert "HF_HUB_OFFLINE=1" in message and str(local_hub.cache_dir) in message and "cannot be reached" in message
    assert not [record for record in caplog.records if "Retrying" in record.getMessage()]


def test_no_network_loads_what_is_cached(local_hub, monkeypatch, tmp_path):
    from huggingface_hub import constants

    backbone = tiny_backbone()
    backbone.save_to_preset(tmp_path / "native")
    local_hub.add_repo("zoo-org/native", tmp_path / "native")
    azk.models.BertBackbone.from_preset("hf://zoo-org/native")
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", endpoint + "/{repo_id}/resolve/{revision}/{filename}")
    loaded = azk.models.BertBackbone.from_preset("hf://zoo-org/native")
    inputs = features()
    np.testing.assert_allclose(
        numpy(loaded(inputs))["sequence_output"], numpy(backbone(inputs))["sequence_output"], atol=1e-6
    )
