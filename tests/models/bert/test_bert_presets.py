"""Saving and loading presets: identical outputs, across tasks and backends."""

import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import keras
import numpy as np
import pytest

import attention_zoo_keras as azk
from tests.support.family_tests import run_backbone_test
from tests.support.family_tests import run_config_round_trip_test
from tests.support.family_tests import run_preset_test
from tests.support.tiny_checkpoints import TINY_VOCABULARY

TEXTS = ["the film was good", "a cat sat on the mat and the dog sat too"]


def tiny_classifier(num_classes=3):
    keras.utils.set_random_seed(1)
    tokenizer = azk.models.BertTokenizer.from_vocabulary(TINY_VOCABULARY)
    backbone = azk.models.BertBackbone(
        vocabulary_size=tokenizer.vocabulary_size, num_layers=2, num_heads=2, hidden_dim=16,
        intermediate_dim=32, max_sequence_length=16,
    )
    preprocessor = azk.models.BertPreprocessor(tokenizer, sequence_length=16)
    return azk.models.BertTextClassifier(backbone=backbone, num_classes=num_classes, preprocessor=preprocessor)


def features(batch, length):
    ids = np.random.default_rng(length).integers(1, 20, (batch, length)).astype("int32")
    return {"token_ids": ids, "segment_ids": np.zeros_like(ids), "padding_mask": np.ones_like(ids)}


def predictions(model):
    return model.predict(TEXTS, verbose=0)


def test_task_round_trip_gives_identical_outputs(tmp_path):
    reloaded = run_preset_test(
        tiny_classifier(), tmp_path / "preset", TEXTS, outputs=predictions,
        expected_files=["README.md", "config.json", "metadata.json", "model.safetensors", "preprocessor.json",
                        "tokenizer.json"],
    )
    assert reloaded.num_classes == 3 and reloaded.preprocessor.sequence_length == 16


def test_backbone_behaviour(tmp_path):
    kwargs = dict(vocabulary_size=20, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16,
                  max_sequence_length=8)
    run_backbone_test(
        azk.models.BertBackbone, kwargs, features(2, 5), {"sequence_output": (2, 5, 8), "pooled_output": (2, 8)},
        tmp_path, variable_input_data=[(features(3, 8), {"sequence_output": (3, 8, 8)})],
    )


def test_saved_files_are_what_the_format_promises(tmp_path):
    tiny_classifier().save_to_preset(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["library"] == "attention_zoo_keras"
    assert config["class_name"] == "BertTextClassifier"
    assert config["config"]["backbone"]["class_name"] == "BertBackbone"
    metadata = json.loads((tmp_path / "metadata.json").read_text())
    assert metadata["saved_with_backend"] == keras.backend.backend()
    assert metadata["parameter_count"] > 0
    card = (tmp_path / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: attention-zoo-keras") and "pipeline_tag: text-classification" in card
    # tokenizer.json is the `tokenizers` format, readable without this library.
    import tokenizers

    assert tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json")).token_to_id("[CLS]") == 2


def test_saved_files_are_readable_by_others_as_plain_files_are(tmp_path):
    # Temporary files and safetensors' writer create files private (0600);
    # a preset to share or publish gets what `open()` under the umask gives.
    umask = os.umask(0o022)
    try:
        tiny_classifier().save_to_preset(tmp_path / "preset")
    finally:
        os.umask(umask)
    modes = {path.name: stat.S_IMODE(path.stat().st_mode) for path in (tmp_path / "preset").iterdir()}
    assert {"model.safetensors", "tokenizer.json", "config.json"} <= set(modes)
    assert all(mode == 0o644 for mode in modes.values()), {name: oct(mode) for name, mode in modes.items()}
    assert stat.S_IMODE((tmp_path / "preset").stat().st_mode) == 0o755


def test_backbone_and_sibling_tasks_load_from_a_task_preset(tmp_path):
    classifier = tiny_classifier()
    classifier.save_to_preset(tmp_path)
    features = classifier.preprocessor(TEXTS)
    backbone = azk.models.BertBackbone.from_preset(str(tmp_path))
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(backbone(features)["sequence_output"]),
        keras.ops.convert_to_numpy(classifier.backbone(features)["sequence_output"]),
    )
    mlm = azk.models.BertMaskedLM.from_preset(str(tmp_path))
    assert mlm.preprocessor.sequence_length == 16  # the shared preprocessor setting carries over
    five_way = azk.models.BertTextClassifier.from_preset(str(tmp_path), num_classes=5)
    assert five_way.predict(TEXTS, verbose=0).shape == (2, 5)


def test_sharded_weights_round_trip(tmp_path):
    run_preset_test(tiny_classifier(), tmp_path, TEXTS, outputs=predictions, save_kwargs={"max_shard_size": "20KB"})
    shards = sorted(p.name for p in tmp_path.glob("model-*.safetensors"))
    assert len(shards) > 1 and not (tmp_path / "model.safetensors").exists()
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == set(shards)


def test_variable_keys_are_stable_across_instances():
    first = [v.path for v in tiny_classifier().weights]
    second = [v.path for v in tiny_classifier().weights]
    assert first == second and len(set(first)) == len(first)


def test_config_round_trip_rebuilds_the_same_architecture():
    classifier = tiny_classifier()
    run_config_round_trip_test(classifier, classifier.preprocessor(TEXTS))


def test_named_presets_are_listed():
    presets = azk.models.BertBackbone.presets
    assert {"bert_tiny", "bert_base", "bert_large", "minilm_l6"} <= set(presets)
    assert presets["bert_base"]["source"] == "hf://google-bert/bert-base-uncased"
    assert presets["minilm_l6"]["source"] == "hf://sentence-transformers/all-MiniLM-L6-v2"
    assert set(azk.models.BertTextClassifier.presets) == set(presets)


OTHER_BACKEND = {"jax": "torch", "torch": "tensorflow", "tensorflow": "jax"}
SAVE_SCRIPT = textwrap.dedent(
    """
    import sys
    import numpy as np
    from tests.models.bert.test_bert_presets import TEXTS, tiny_classifier
    classifier = tiny_classifier()
    classifier.save_to_preset(sys.argv[1])
    np.save(sys.argv[2], classifier.predict(TEXTS, verbose=0))
    """
)


@pytest.mark.slow
def test_preset_saved_under_another_backend_loads_with_the_same_outputs(tmp_path):
    other = OTHER_BACKEND[keras.backend.backend()]
    environment = {**os.environ, "KERAS_BACKEND": other, "TF_CPP_MIN_LOG_LEVEL": "2"}
    root = Path(__file__).resolve().parents[3]
    subprocess.run(
        [sys.executable, "-c", SAVE_SCRIPT, str(tmp_path / "preset"), str(tmp_path / "expected.npy")],
        check=True, cwd=root, env=environment,
    )
    assert json.loads((tmp_path / "preset" / "metadata.json").read_text())["saved_with_backend"] == other
    reloaded = azk.models.BertTextClassifier.from_preset(str(tmp_path / "preset"))
    np.testing.assert_allclose(reloaded.predict(TEXTS, verbose=0), np.load(tmp_path / "expected.npy"), atol=1e-5)


def test_dtype_policy_survives_the_round_trip(tmp_path):
    backbone = azk.models.BertBackbone(
        vocabulary_size=20, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16,
        max_sequence_length=8, dtype="bfloat16",
    )
    assert {v.dtype for v in backbone.weights} == {"bfloat16"}
    run_preset_test(backbone, tmp_path, features(2, 5))
    as_float32 = azk.models.BertBackbone.from_preset(str(tmp_path), dtype="float32")
    assert {v.dtype for v in as_float32.weights} == {"float32"}
