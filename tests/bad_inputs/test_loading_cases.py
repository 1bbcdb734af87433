"""Bad presets and bad `from_preset` arguments, and the errors they get: a
table of cases, each run by `test_bad_loading_input`. Every case edits a
fresh copy of a tiny native preset (or passes a bad argument) and expects the
library's error naming the key, argument, tensor or shard at fault, with a
close-name suggestion where one exists."""

import json
import shutil

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
from attention_zoo_keras.registration import UnregisteredClassError

VOCABULARY = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat"]
BACKBONE_ARGUMENTS = dict(vocabulary_size=len(VOCABULARY), num_layers=1, num_heads=2, hidden_dim=8,
                          intermediate_dim=16, max_sequence_length=8)


def _backbone():
    keras.utils.set_random_seed(0)
    return azk.models.BertBackbone(**BACKBONE_ARGUMENTS)


@pytest.fixture(scope="module")
def templates(tmp_path_factory):
    root = tmp_path_factory.mktemp("loading_templates")
    preprocessor = azk.models.BertPreprocessor(azk.models.BertTokenizer.from_vocabulary(VOCABULARY), sequence_length=8)
    backbone = _backbone()
    backbone.save_to_preset(root / "backbone")
    preprocessor.save_to_preset(root / "backbone")
    azk.models.BertTextClassifier(backbone, num_classes=2, preprocessor=preprocessor).save_to_preset(root / "classifier")
    backbone.save_to_preset(root / "sharded", max_shard_size="1KB")
    return root


@pytest.fixture
def presets(templates, tmp_path):
    """Fresh copies of the templates, `{name: path}`, for a case to edit."""
    copies = {}
    for template in templates.iterdir():
        copies[template.name] = tmp_path / template.name
        shutil.copytree(template, copies[template.name])
    return copies


def _edit_json(path, change):
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))
    return path


def _edit_weights(directory, change):
    path = directory / "model.safetensors"
    save_file(change(dict(load_file(str(path)))), str(path), metadata={"format": "np"})
    return directory


def _load_backbone(directory, **kwargs):
    return azk.models.BertBackbone.from_preset(str(directory), **kwargs)


def _load_classifier(directory, **kwargs):
    return azk.models.BertTextClassifier.from_preset(str(directory), **kwargs)


def _config_edit(name, change, load=_load_backbone):
    def case(presets):
        return load(_edit_json(presets[name] / "config.json", change).parent)

    return case


def _weights_edit(name, change, load=_load_backbone):
    def case(presets):
        return load(_edit_weights(presets[name], change))

    return case


def _shard_named(shard):
    def case(presets):
        index = presets["sharded"] / "model.safetensors.index.json"
        _edit_json(index, lambda data: data["weight_map"].update({next(iter(data["weight_map"])): shard}))
        return _load_backbone(presets["sharded"])

    return case


def _two_heads_of_one_class(presets):
    backbone = _backbone()
    first = azk.models.BertTextClassifier(backbone, num_classes=2)
    second = azk.models.BertTextClassifier(backbone, num_classes=3)
    return save_preset_with_heads(backbone, [first, second], presets["backbone"].parent / "heads")


# (id, case(presets), expected exception, regex the message must match)
CASES = [
    ("task_kwarg_misspelt", lambda p: _load_classifier(p["classifier"], num_clases=3),
     UnknownArgumentError, r"'num_clases'.*Did you mean: num_classes"),
    ("backbone_kwarg_misspelt", lambda p: _load_backbone(p["backbone"], dropuot=0.5),
     UnknownArgumentError, r"'dropuot'.*Did you mean: dropout"),
    ("force_download_misspelt", lambda p: _load_backbone(p["backbone"], force_downlod=True),
     UnknownArgumentError, r"'force_downlod'.*Did you mean: force_download"),
    ("backbone_constructor_misspelt", lambda p: azk.models.BertBackbone(**BACKBONE_ARGUMENTS, dropuot=0.5),
     UnknownArgumentError, r"BertBackbone\(\.\.\.\): BertBackbone has no argument 'dropuot'.*dropout"),
    ("task_constructor_misspelt", lambda p: azk.models.BertTextClassifier(_backbone(), num_classes=2, dropuot=0.1),
     UnknownArgumentError, r"'dropuot'.*Did you mean: dropout"),
    ("preprocessor_kwarg_misspelt",
     lambda p: azk.models.BertPreprocessor.from_preset(str(p["backbone"]), sequence_lenght=4),
     UnknownArgumentError, r"'sequence_lenght'.*Did you mean: sequence_length"),
    ("config_json_unknown_backbone_key", _config_edit("backbone", lambda c: c["config"].update(num_layer=2)),
     UnknownArgumentError, r"config\.json of .*'num_layer'.*Did you mean: num_layers"),
    ("config_json_unknown_nested_backbone_key",
     _config_edit("classifier", lambda c: c["config"]["backbone"]["config"].update(hiden_dim=8)),
     UnknownArgumentError, r"'hiden_dim'.*Did you mean: hidden_dim"),
    ("config_json_unknown_task_key", _config_edit("classifier", lambda c: c["config"].update(num_clases=2), _load_classifier),
     UnknownArgumentError, r"config\.json .*'num_clases'.*num_classes"),
    ("config_json_unknown_top_level_key", _config_edit("backbone", lambda c: c.update(libary="x")),
     PresetFileError, r"unknown key 'libary'.*Did you mean: library"),
    ("preprocessor_json_unknown_key",
     lambda p: azk.models.BertPreprocessor.from_preset(
         str(_edit_json(p["backbone"] / "preprocessor.json", lambda d: d["config"].update(lowercse=True)).parent)),
     UnknownArgumentError, r"preprocessor\.json of .*'lowercse'"),
    ("stray_tensor", _weights_edit("backbone", lambda a: {**a, "extra/kernel": np.zeros(2, "float32")}),
     CheckpointMismatchError, r"no variable of BertBackbone takes: extra/kernel"),
    ("quantization_scale_tensor",
     _weights_edit("backbone", lambda a: {**a, "pooler/kernel_scale": np.ones(8, "float32")}),
     CheckpointMismatchError, r"pooler/kernel_scale.*quantized"),
    ("task_preset_without_its_head",
     _weights_edit("classifier", lambda a: {k: v for k, v in a.items() if k != "classifier/bias"}, _load_classifier),
     CheckpointMismatchError, r"lacks tensors of this BertTextClassifier preset: classifier/bias"),
    ("head_of_an_undeclared_task",
     _weights_edit("backbone", lambda a: {**a, "heads/BertMaskedLM/mlm_head/output_bias": np.zeros(8, "float32")}),
     CheckpointMismatchError, r"heads/BertMaskedLM/mlm_head/output_bias"),
    ("heads_naming_an_unregistered_class", _config_edit("backbone", lambda c: c.update(heads={"BertTextClassifer": {}})),
     UnregisteredClassError, r"'BertTextClassifer'.*Did you mean: BertTextClassifier"),
    ("heads_not_a_mapping", _config_edit("backbone", lambda c: c.update(heads=["BertTextClassifier"])),
     PresetFileError, r"'heads' in config\.json .* must map task class names"),
    ("huge_vocabulary_size", _config_edit("backbone", lambda c: c["config"].update(vocabulary_size=2_000_000_000)),
     CheckpointMismatchError, r"has \(8, 8\): BertBackbone argument 'vocabulary_size' is 2000000000"),
    ("huge_override", lambda p: _load_backbone(p["backbone"], max_sequence_length=10**9),
     CheckpointMismatchError, r"'position_embedding/embeddings'.*'max_sequence_length' is 1000000000"),
    ("shard_with_dot_dot", _shard_named("../../x.safetensors"),
     PresetFileError, r"shard '\.\./\.\./x\.safetensors', which lies outside the preset"),
    ("shard_absolute", _shard_named("/etc/passwd"),
     PresetFileError, r"shard '/etc/passwd', which lies outside the preset"),
    ("shard_not_a_name", _shard_named(7),
     PresetFileError, r"maps '.*' to 7, which is not a file name"),
    ("empty_revision", lambda p: _load_backbone("hf://org/repo@"),
     UnknownPresetError, r"revision after '@' is empty"),
    ("two_heads_of_one_class", _two_heads_of_one_class,
     ValueError, r"two BertTextClassifier tasks"),
]


@pytest.mark.parametrize(("case", "error", "message"), [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_bad_loading_input(presets, case, error, message):
    with pytest.raises(error, match=message):
        case(presets)


def test_the_table_is_large_and_unique():
    assert len(CASES) >= 15 and len({case[0] for case in CASES}) == len(CASES)
