"""BERT fails loudly and precisely on bad presets, bad inputs and failed saves.

Every test asserts the error type *and* what its message names (the handle,
file, variable key, shapes, id, range or length), with tiny models: a
one-layer 8-wide `BertBackbone` over a 15-token vocabulary, or the tiny
`transformers` checkpoints of `tiny_bert_checkpoints`. No hub is involved.
"""

from __future__ import annotations

import json
import re
import shutil
import sys

import keras
import numpy as np
import pytest

from attention_zoo_keras.hub import PresetFileError
from attention_zoo_keras.hub import UnknownPresetError
from attention_zoo_keras.hub import preset_format
from attention_zoo_keras.models import BertBackbone
from attention_zoo_keras.models import BertMaskedLM
from attention_zoo_keras.models import BertPreprocessor
from attention_zoo_keras.models import BertTextClassifier
from attention_zoo_keras.models import BertTextEmbedder
from attention_zoo_keras.models import BertTokenizer
from attention_zoo_keras.registration import UnregisteredClassError

VOCABULARY = [
    "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",
    "the", "cat", "sat", "on", "mat", "a", "great", "film", "dull", "long",
]
VOCABULARY_SIZE = len(VOCABULARY)  # 15
MAX_LENGTH = 16
PAD, CLS, SEP = 0, 2, 3
TEXTS = ["the cat sat on the mat", "a great film"]
LONG_TEXT = " ".join(["the cat sat on the mat"] * 6)  # 36 words, far over 16 tokens


def _backbone(**overrides):
    arguments = dict(
        vocabulary_size=VOCABULARY_SIZE, num_layers=1, num_heads=2, hidden_dim=8,
        intermediate_dim=16, max_sequence_length=MAX_LENGTH,
    )
    return BertBackbone(**{**arguments, **overrides})


def _tokenizer():
    return BertTokenizer.from_vocabulary(VOCABULARY)


def _classifier(num_classes=2, sequence_length=MAX_LENGTH, **backbone_overrides):
    preprocessor = BertPreprocessor(_tokenizer(), sequence_length=sequence_length)
    return BertTextClassifier(_backbone(**backbone_overrides), num_classes=num_classes, preprocessor=preprocessor)


def _features(length=8, **replace):
    """Valid features `(2, length)` with ids in range; `replace` sets one entry at [0, 1]."""
    token_ids = np.full((2, length), 5, dtype="int32")
    token_ids[:, 0], token_ids[:, -1] = CLS, SEP
    features = {
        "token_ids": token_ids,
        "segment_ids": np.zeros((2, length), dtype="int32"),
        "padding_mask": np.ones((2, length), dtype="int32"),
    }
    for key, value in replace.items():
        features[key] = features[key].copy()
        features[key][0, 1] = value
    return features


def _numpy(outputs):
    if isinstance(outputs, dict):
        return {key: keras.ops.convert_to_numpy(value) for key, value in outputs.items()}
    return keras.ops.convert_to_numpy(outputs)


def _edit_json(path, edit):
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def _leftovers(parent):
    """Hidden staging or backup directories a save may have left in `parent`."""
    return sorted(p.name for p in parent.iterdir() if p.name.endswith((".partial", ".old")) or p.name.startswith("."))


@pytest.fixture
def backbone_preset(tmp_path):
    """A saved native `BertBackbone` preset directory."""
    directory = tmp_path / "backbone_preset"
    _backbone().save_to_preset(directory)
    return directory


@pytest.fixture
def classifier_preset(tmp_path):
    """A saved native `BertTextClassifier` preset (with preprocessor) directory."""
    directory = tmp_path / "classifier_preset"
    _classifier().save_to_preset(directory)
    return directory


@pytest.fixture
def transformers_dir(tmp_path, tiny_bert_checkpoints):
    """A private copy of the tiny `transformers` `BertModel` checkpoint."""
    directory = tmp_path / "transformers_bert"
    shutil.copytree(tiny_bert_checkpoints["model"], directory)
    return directory


# --- handles ---------------------------------------------------------------


@pytest.mark.parametrize("cls", [BertBackbone, BertTextClassifier, BertMaskedLM, BertTextEmbedder, BertPreprocessor])
def test_unknown_preset_name_lists_close_names(cls):
    with pytest.raises(UnknownPresetError, match=r"Unknown preset 'bert_bsae'\. Did you mean: bert_base\b") as info:
        cls.from_preset("bert_bsae")
    assert isinstance(info.value, ValueError)
    assert "known bert names: bert_base, bert_large, bert_tiny, minilm_l6." in str(info.value)


def test_a_preset_name_in_other_case_is_suggested():
    with pytest.raises(UnknownPresetError, match=r"Unknown preset 'BERT_BASE'\. Did you mean: bert_base\b"):
        BertBackbone.from_preset("BERT_BASE")


@pytest.mark.parametrize("cls", [BertBackbone, BertTextClassifier, BertPreprocessor])
def test_preset_of_another_family_is_refused_before_any_download(cls):
    with pytest.raises(UnknownPresetError, match=r"Preset 'gpt2' is a gpt model, not bert; bert presets: bert_base"):
        cls.from_preset("gpt2")


@pytest.mark.parametrize("handle", ["{tmp}/no_such_preset", "./no_such_preset_dir/sub", "~/no-such-azk-preset-dir", "a/b/c"])
def test_path_handle_that_does_not_exist(tmp_path, handle):
    handle = handle.format(tmp=tmp_path)
    with pytest.raises(PresetFileError, match=rf"Preset directory '{re.escape(handle)}' does not exist"):
        BertBackbone.from_preset(handle)


def test_path_object_handle_that_does_not_exist(tmp_path):
    with pytest.raises(PresetFileError, match="does not exist"):
        BertTextClassifier.from_preset(tmp_path / "missing", num_classes=2)


# --- weights files -----------------------------------------------------------


@pytest.mark.parametrize("preset", ["backbone_preset", "transformers_dir"])
def test_preset_without_weights_names_the_file(request, preset):
    directory = request.getfixturevalue(preset)
    (directory / "model.safetensors").unlink()

    with pytest.raises(PresetFileError, match=r"has no weights: neither 'model\.safetensors'"):
        BertBackbone.from_preset(directory)


def _garbage(data):
    return b"\x00not a safetensors file\xff" * 20


def _truncated_half(data):
    return data[: len(data) // 2]


def _truncated_in_header(data):
    return data[:20]


def _truncated_last_byte(data):
    return data[:-1]


def _empty(data):
    return b""


@pytest.mark.parametrize("corrupt", [_garbage, _truncated_half, _truncated_in_header, _truncated_last_byte, _empty])
@pytest.mark.parametrize("preset", ["backbone_preset", "transformers_dir"])
def test_corrupt_weights_file_is_named(request, preset, corrupt):
    directory = request.getfixturevalue(preset)
    weights = directory / "model.safetensors"
    weights.write_bytes(corrupt(weights.read_bytes()))

    with pytest.raises(PresetFileError, match=r"'model\.safetensors' of preset '.*' is not a readable safetensors file"):
        BertBackbone.from_preset(directory)


def test_corrupt_weights_of_a_task_preset_are_named(classifier_preset):
    weights = classifier_preset / "model.safetensors"
    weights.write_bytes(_truncated_half(weights.read_bytes()))

    with pytest.raises(PresetFileError, match=r"'model\.safetensors'.*not a readable safetensors file"):
        BertTextClassifier.from_preset(classifier_preset)


def test_missing_shard_is_named(tmp_path):
    directory = tmp_path / "sharded"
    _backbone().save_to_preset(directory, max_shard_size="1KB")
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1 and not (directory / "model.safetensors").exists()
    (directory / shards[-1]).unlink()

    with pytest.raises(PresetFileError, match=rf"has no file '{re.escape(shards[-1])}'"):
        BertBackbone.from_preset(directory)


# --- shapes that do not fit the config ---------------------------------------


def _mismatch(key, expected, found):
    return (
        rf"Shape mismatch for variable '{re.escape(key)}': the model expects {re.escape(str(expected))} "
        rf"but checkpoint '.*' has {re.escape(str(found))}"
    )


@pytest.mark.parametrize(
    "setting, value, key, expected, found",
    [
        ("intermediate_dim", 12, "transformer_layer_0/feed_forward/intermediate/kernel", (8, 12), (8, 16)),
        ("hidden_dim", 12, "token_embedding/embeddings", (VOCABULARY_SIZE, 12), (VOCABULARY_SIZE, 8)),
        ("vocabulary_size", 20, "token_embedding/embeddings", (20, 8), (VOCABULARY_SIZE, 8)),
        ("max_sequence_length", 32, "position_embedding/embeddings", (32, 8), (MAX_LENGTH, 8)),
    ],
)
def test_native_config_that_does_not_fit_the_weights(backbone_preset, setting, value, key, expected, found):
    _edit_json(backbone_preset / "config.json", lambda c: c["config"].__setitem__(setting, value))

    with pytest.raises(ValueError, match=_mismatch(key, expected, found)):
        BertBackbone.from_preset(backbone_preset)


def test_native_task_config_that_does_not_fit_the_weights(classifier_preset):
    _edit_json(
        classifier_preset / "config.json",
        lambda c: c["config"]["backbone"]["config"].__setitem__("intermediate_dim", 12),
    )
    key = "transformer_layer_0/feed_forward/intermediate/kernel"

    with pytest.raises(ValueError, match=_mismatch(key, (8, 12), (8, 16))):
        BertTextClassifier.from_preset(classifier_preset)
    with pytest.raises(ValueError, match=_mismatch(key, (8, 12), (8, 16))):
        BertBackbone.from_preset(classifier_preset)


@pytest.mark.parametrize(
    "setting, value, key, expected, found",
    [
        ("intermediate_size", 48, "transformer_layer_0/feed_forward/intermediate/kernel", (32, 48), (32, 64)),
        ("max_position_embeddings", 32, "position_embedding/embeddings", (32, 32), (64, 32)),
    ],
)
def test_transformers_config_that_does_not_fit_the_weights(transformers_dir, setting, value, key, expected, found):
    _edit_json(transformers_dir / "config.json", lambda c: c.__setitem__(setting, value))

    with pytest.raises(ValueError, match=_mismatch(key, expected, found)):
        BertBackbone.from_preset(transformers_dir)


# --- classes a config may name -----------------------------------------------

CANARY_MODULE = "azk_canary_module_for_tests"
CANARY_SOURCE = """
import pathlib
pathlib.Path({marker!r}).write_text("imported")

class Canary:
    def __init__(self, **kwargs):
        pathlib.Path({marker!r}).write_text("constructed")

    @classmethod
    def from_config(cls, config):
        return cls(**config)
"""


@pytest.fixture
def canary(tmp_path, monkeypatch):
    """An importable module that leaves a marker file if imported or instantiated."""
    marker = tmp_path / "canary_marker"
    module_dir = tmp_path / "canary_path"
    module_dir.mkdir()
    (module_dir / f"{CANARY_MODULE}.py").write_text(CANARY_SOURCE.format(marker=str(marker)))
    monkeypatch.syspath_prepend(str(module_dir))
    assert CANARY_MODULE not in sys.modules
    return marker


def _assert_untouched(marker):
    assert CANARY_MODULE not in sys.modules
    assert not marker.exists(), f"the canary was {marker.read_text()}"


@pytest.mark.parametrize("cls", [BertBackbone, BertTextClassifier, BertTextEmbedder])
def test_config_naming_an_importable_class_builds_nothing(backbone_preset, canary, cls):
    def point_at_canary(config):
        config["class_name"] = f"{CANARY_MODULE}.Canary"
        config["registered_name"] = f"{CANARY_MODULE}>Canary"
        config["module"] = CANARY_MODULE

    _edit_json(backbone_preset / "config.json", point_at_canary)

    with pytest.raises(UnregisteredClassError, match=rf"'{CANARY_MODULE}\.Canary'.*has not registered"):
        cls.from_preset(backbone_preset, **({} if cls is BertBackbone else {"preprocessor": None}))
    _assert_untouched(canary)


def test_config_naming_os_system_runs_nothing(backbone_preset, tmp_path):
    marker = tmp_path / "os_system_ran"
    _edit_json(
        backbone_preset / "config.json",
        lambda c: c.update(class_name="os.system", config={"command": f"touch {marker}"}),
    )

    with pytest.raises(UnregisteredClassError, match=r"'os\.system', which attention_zoo_keras has not registered"):
        BertBackbone.from_preset(backbone_preset)
    assert not marker.exists()


@pytest.mark.parametrize("class_name", ["LSTM", "keras.layers.Dense", "keras_hub>BertBackbone"])
def test_config_naming_a_keras_class_is_refused(backbone_preset, class_name):
    _edit_json(backbone_preset / "config.json", lambda c: c.__setitem__("class_name", class_name))

    with pytest.raises(UnregisteredClassError, match=rf"names the class '{re.escape(class_name)}'"):
        BertBackbone.from_preset(backbone_preset)


def test_task_config_nesting_an_unregistered_backbone_builds_nothing(classifier_preset, canary):
    _edit_json(
        classifier_preset / "config.json",
        lambda c: c["config"]["backbone"].update(class_name=f"{CANARY_MODULE}.Canary", config={}),
    )

    with pytest.raises(UnregisteredClassError, match=rf"'{CANARY_MODULE}\.Canary'"):
        BertTextClassifier.from_preset(classifier_preset)
    with pytest.raises(UnregisteredClassError, match=rf"'{CANARY_MODULE}\.Canary'"):
        BertBackbone.from_preset(classifier_preset)
    _assert_untouched(canary)


def test_preprocessor_file_naming_an_unregistered_class_is_refused(classifier_preset, canary):
    _edit_json(classifier_preset / "preprocessor.json", lambda c: c.__setitem__("class_name", f"{CANARY_MODULE}.Canary"))

    with pytest.raises(UnregisteredClassError, match=rf"preprocessor\.json.*'{CANARY_MODULE}\.Canary'"):
        BertPreprocessor.from_preset(classifier_preset)
    _assert_untouched(canary)


@pytest.mark.parametrize("class_name", [["BertBackbone"], {"name": "BertBackbone"}])
def test_non_string_class_name_is_refused_as_unregistered(backbone_preset, class_name):
    _edit_json(backbone_preset / "config.json", lambda c: c.__setitem__("class_name", class_name))

    with pytest.raises(UnregisteredClassError, match="has not registered"):
        BertBackbone.from_preset(backbone_preset)


# --- ids out of range ----------------------------------------------------------

OUT_OF_RANGE = [
    ("token_ids", VOCABULARY_SIZE, rf"'token_ids' holds the id {VOCABULARY_SIZE}, outside the valid range \[0, {VOCABULARY_SIZE}\)"),
    ("token_ids", 1000, rf"'token_ids' holds the id 1000, outside the valid range \[0, {VOCABULARY_SIZE}\)"),
    ("token_ids", -1, rf"'token_ids' holds the id -1, outside the valid range \[0, {VOCABULARY_SIZE}\)"),
    ("segment_ids", 2, r"'segment_ids' holds the id 2, outside the valid range \[0, 2\)"),
    ("segment_ids", -1, r"'segment_ids' holds the id -1, outside the valid range \[0, 2\)"),
]


@pytest.mark.parametrize("key, value, message", OUT_OF_RANGE)
def test_out_of_range_ids_called_on_the_backbone(key, value, message):
    backbone = _backbone()
    with pytest.raises(ValueError, match=message):
        backbone(_features(**{key: value}))
    # Backend tensors (not only numpy arrays) are checked too.
    tensors = {k: keras.ops.convert_to_tensor(v) for k, v in _features(**{key: value}).items()}
    with pytest.raises(ValueError, match=message):
        backbone(tensors)


@pytest.mark.parametrize("key, value, message", OUT_OF_RANGE[:1] + OUT_OF_RANGE[3:4])
def test_out_of_range_ids_given_as_python_lists(key, value, message):
    # Plain lists count as concrete inputs, so they are checked like arrays.
    lists = {k: v.tolist() for k, v in _features(**{key: value}).items()}
    with pytest.raises(ValueError, match=message):
        _backbone()(lists)


@pytest.mark.parametrize("key, value, message", OUT_OF_RANGE)
def test_out_of_range_ids_predicted_by_a_task(key, value, message):
    classifier = _classifier()
    with pytest.raises(ValueError, match=message):
        classifier.predict(_features(**{key: value}), verbose=0)
    with pytest.raises(ValueError, match=message):
        classifier(_features(**{key: value}))
    with pytest.raises(ValueError, match=message):
        BertTextEmbedder(_backbone()).predict(_features(**{key: value}), verbose=0)


@pytest.mark.parametrize("key, value, message", OUT_OF_RANGE[:1] + OUT_OF_RANGE[3:4])
def test_out_of_range_ids_predicted_by_the_backbone(key, value, message):
    # `Backbone.predict` is `keras.Model.predict`: it must not hand unchecked
    # ids to a compiled graph (JAX gathers silently return NaN there).
    with pytest.raises(ValueError, match=message):
        _backbone().predict(_features(**{key: value}), verbose=0)


def test_valid_ids_at_the_edges_of_the_range_are_accepted():
    features = _features(token_ids=VOCABULARY_SIZE - 1, segment_ids=1)
    outputs = _numpy(_backbone()(features))
    assert outputs["sequence_output"].shape == (2, 8, 8)
    assert np.isfinite(outputs["sequence_output"]).all()


# --- lengths --------------------------------------------------------------------


def test_preprocessor_truncates_a_long_text_to_the_sequence_length():
    tokenizer = _tokenizer()
    features = BertPreprocessor(tokenizer, sequence_length=MAX_LENGTH)([LONG_TEXT, "a great film"])
    words = tokenizer.encode([LONG_TEXT])[0]
    assert len(words) > MAX_LENGTH

    token_ids, padding_mask = features["token_ids"], features["padding_mask"]
    assert token_ids.shape == features["segment_ids"].shape == padding_mask.shape == (2, MAX_LENGTH)
    assert padding_mask[0].tolist() == [1] * MAX_LENGTH
    assert token_ids[0].tolist() == [CLS] + words[: MAX_LENGTH - 2] + [SEP]
    # The short text is padded, its last real token [SEP].
    assert token_ids[1].tolist() == [CLS, 10, 11, 12, SEP] + [PAD] * (MAX_LENGTH - 5)
    assert padding_mask[1].tolist() == [1] * 5 + [0] * (MAX_LENGTH - 5)
    # And the truncated features run through the model.
    assert _numpy(_backbone()(features))["sequence_output"].shape == (2, MAX_LENGTH, 8)


def test_preprocessor_truncates_a_long_pair_keeping_both_separators():
    features = BertPreprocessor(_tokenizer(), sequence_length=MAX_LENGTH)(([LONG_TEXT], [LONG_TEXT]))

    token_ids = features["token_ids"][0].tolist()
    assert len(token_ids) == MAX_LENGTH and features["padding_mask"][0].tolist() == [1] * MAX_LENGTH
    assert token_ids[0] == CLS and token_ids[-1] == SEP and token_ids.count(SEP) == 2
    first_sep = token_ids.index(SEP)
    assert features["segment_ids"][0].tolist() == [0] * (first_sep + 1) + [1] * (MAX_LENGTH - first_sep - 1)


@pytest.mark.parametrize("length", [MAX_LENGTH + 1, 40])
def test_ids_longer_than_the_maximum_length_are_refused(length):
    message = rf"'token_ids' has length {length}, longer than the model's maximum sequence length {MAX_LENGTH}"
    with pytest.raises(ValueError, match=message):
        _backbone()(_features(length=length))
    with pytest.raises(ValueError, match=message):
        _classifier().predict(_features(length=length), verbose=0)


def test_ids_of_exactly_the_maximum_length_are_accepted():
    outputs = _numpy(_backbone()(_features(length=MAX_LENGTH)))
    assert outputs["sequence_output"].shape == (2, MAX_LENGTH, 8)


def test_raw_text_padded_beyond_the_model_maximum_length_is_refused():
    # A preprocessor padding to 32 in front of a 16-position model: raw text
    # must not reach the position-embedding gather with positions 16..31
    # (NaN on JAX, a graph error on TensorFlow). Refusing at construction is
    # fine too, hence both inside `raises`.
    with pytest.raises(ValueError, match="maximum sequence length"):
        classifier = _classifier(sequence_length=2 * MAX_LENGTH)
        classifier.predict([LONG_TEXT], verbose=0)


def test_raw_text_with_ids_beyond_the_model_vocabulary_is_refused():
    # The tokenizer knows 15 tokens, the model only 10: raw text must not
    # reach the embedding gather with ids 10..14 (silently NaN on JAX).
    preprocessor = BertPreprocessor(_tokenizer(), sequence_length=8)
    classifier = BertTextClassifier(_backbone(vocabulary_size=10), num_classes=2, preprocessor=preprocessor)
    with pytest.raises(ValueError, match=r"'token_ids' holds the id 1[0-4], outside the valid range \[0, 10\)"):
        classifier.predict(["the great film"], verbose=0)


# --- saving ------------------------------------------------------------------------


def _fail_after(real, exception):
    def failing(*args, **kwargs):
        real(*args, **kwargs)  # the files are written into the staging directory...
        raise exception  # ...and then the save dies

    return failing


@pytest.mark.parametrize("step", ["save_arrays", "write_preprocessor_files", "model_card"])
@pytest.mark.parametrize("exception", [OSError("disk full"), KeyboardInterrupt()])
def test_interrupted_save_keeps_the_previous_preset(tmp_path, monkeypatch, step, exception):
    directory = tmp_path / "presets" / "classifier"
    first = _classifier(num_classes=2)
    first.save_to_preset(directory)
    expected = _numpy(first(first.preprocessor(TEXTS)))
    files_before = sorted(p.name for p in directory.iterdir())

    monkeypatch.setattr(preset_format, step, _fail_after(getattr(preset_format, step), exception))
    second = _classifier(num_classes=3, intermediate_dim=12)  # a different model
    with pytest.raises(type(exception)):
        second.save_to_preset(directory)
    monkeypatch.undo()

    assert _leftovers(directory.parent) == []
    assert sorted(p.name for p in directory.iterdir()) == files_before
    loaded = BertTextClassifier.from_preset(directory)
    assert loaded.num_classes == 2 and loaded.backbone.intermediate_dim == 16
    np.testing.assert_allclose(_numpy(loaded(loaded.preprocessor(TEXTS))), expected, atol=1e-6, rtol=0)


def test_interrupted_first_save_leaves_nothing(tmp_path, monkeypatch):
    directory = tmp_path / "presets" / "backbone"
    monkeypatch.setattr(preset_format, "save_arrays", _fail_after(preset_format.save_arrays, OSError("disk full")))

    with pytest.raises(OSError, match="disk full"):
        _backbone().save_to_preset(directory)

    assert not directory.exists()
    assert _leftovers(directory.parent) == []


def test_successful_save_over_a_preset_replaces_it(tmp_path, backbone_preset):
    replacement = _backbone(intermediate_dim=12)
    replacement.save_to_preset(backbone_preset)

    assert _leftovers(backbone_preset.parent) == []
    loaded = BertBackbone.from_preset(backbone_preset)
    assert loaded.intermediate_dim == 12
    np.testing.assert_allclose(
        _numpy(loaded(_features()))["sequence_output"],
        _numpy(replacement(_features()))["sequence_output"],
        atol=1e-6, rtol=0,
    )


@pytest.mark.parametrize("model", [_backbone, _classifier])
def test_saving_over_a_regular_file_is_refused(tmp_path, model):
    target = tmp_path / "not_a_directory"
    target.write_text("precious")

    with pytest.raises(NotADirectoryError, match=r"Cannot save a preset to '.*not_a_directory': it is a file"):
        model().save_to_preset(target)

    assert target.read_text() == "precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["not_a_directory"]


def test_a_bad_batch_in_predict_leaves_the_model_usable():
    # On JAX, Keras detaches the weights while its loops run; an error from
    # a later batch (here: ids the model does not know) must not lose them.
    preprocessor = BertPreprocessor(_tokenizer(), sequence_length=8)
    classifier = BertTextClassifier(_backbone(vocabulary_size=10), num_classes=2, preprocessor=preprocessor)
    good = ["the cat sat", "on the mat"]  # ids below 10
    before = classifier.predict(good, verbose=0)
    with pytest.raises(ValueError, match="outside the valid range"):
        classifier.predict(good + ["a great film"], batch_size=1, verbose=0)
    np.testing.assert_allclose(classifier.predict(good, verbose=0), before, atol=1e-6)


def test_a_bad_batch_in_fit_keeps_the_weights_trained_so_far():
    keras.utils.set_random_seed(0)
    preprocessor = BertPreprocessor(_tokenizer(), sequence_length=8)
    classifier = BertTextClassifier(_backbone(vocabulary_size=10), num_classes=2, preprocessor=preprocessor)
    classifier.compile(optimizer=keras.optimizers.Adam(1e-2))
    initial = [keras.ops.convert_to_numpy(w).copy() for w in classifier.trainable_weights]
    with pytest.raises(ValueError, match="outside the valid range"):
        classifier.fit(["the cat sat", "on the mat", "a great film"], [0, 1, 0], batch_size=1, shuffle=False, verbose=0)
    after = [keras.ops.convert_to_numpy(w) for w in classifier.trainable_weights]
    assert all(np.isfinite(w).all() for w in after)
    assert any(not np.allclose(a, b) for a, b in zip(initial, after))  # the two good steps were kept
    classifier.fit(["the cat sat", "on the mat"], [0, 1], batch_size=1, verbose=0)
    assert np.isfinite(classifier.predict(["the cat sat"], verbose=0)).all()
