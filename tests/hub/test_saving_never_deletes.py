"""Saving a preset never deletes what it did not write (issue 19, item 1).

`save_to_preset(path)` used to empty `path` whatever it held: a user's
notes, the working directory (`save_to_preset(".")`), a `.git` folder. A
directory that is neither empty nor a preset of this library is now refused
untouched; replacing a preset stays atomic and keeps the files the preset did
not write; a symbolic link to a preset stays a link.
"""

import json
import os

import numpy as np
import pytest

import attention_zoo_keras as azk
from attention_zoo_keras.hub.atomic import DirectoryNotReplaceableError
from attention_zoo_keras.hub.preset_format import preset_entries

# Files, HTTP and error messages: the same code on every backend (scripts/test.sh runs it on torch).
pytestmark = pytest.mark.backend_independent


def _tiny_backbone(seed=0):
    import keras

    keras.utils.set_random_seed(seed)
    return azk.models.BertBackbone(
        vocabulary_size=20, num_layers=1, num_heads=1, hidden_dim=8, intermediate_dim=8, max_sequence_length=8
    )


def _snapshot(directory):
    """`{relative path: bytes}` of every file under `directory`."""
    return {
        str(path.relative_to(directory)): path.read_bytes()
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }


def _leftovers(parent):
    """Hidden staging or backup entries a save left in `parent`."""
    return sorted(entry.name for entry in parent.iterdir() if entry.name.endswith((".old", ".partial")))


def test_a_directory_with_user_files_is_refused_and_left_intact(tmp_path):
    target = tmp_path / "work"
    target.mkdir()
    (target / "notes.txt").write_text("my notes")
    (target / "data").mkdir()
    (target / "data" / "train.csv").write_text("a,b\n")
    before = _snapshot(target)

    with pytest.raises(DirectoryNotReplaceableError, match=r"not empty \(data, notes.txt\).*not a preset"):
        _tiny_backbone().save_to_preset(target)

    assert _snapshot(target) == before
    assert _leftovers(tmp_path) == []


def test_saving_to_the_working_directory_does_not_wipe_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "analysis.ipynb").write_text("{}")

    with pytest.raises(DirectoryNotReplaceableError, match="analysis.ipynb"):
        _tiny_backbone().save_to_preset(".")

    assert (tmp_path / "analysis.ipynb").read_text() == "{}"


def test_a_transformers_checkpoint_directory_is_not_overwritten(tmp_path):
    target = tmp_path / "hf_checkpoint"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"model_type": "bert"}))
    (target / "model.safetensors").write_bytes(b"weights of someone else")

    with pytest.raises(DirectoryNotReplaceableError, match="not a preset saved by attention_zoo_keras"):
        _tiny_backbone().save_to_preset(target)

    assert (target / "model.safetensors").read_bytes() == b"weights of someone else"


def test_an_empty_or_missing_directory_is_written(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    _tiny_backbone().save_to_preset(empty)
    _tiny_backbone().save_to_preset(tmp_path / "new" / "nested")
    for directory in (empty, tmp_path / "new" / "nested"):
        assert (directory / "config.json").is_file() and (directory / "model.safetensors").is_file()


def test_replacing_a_preset_keeps_user_files_and_drops_stale_shards(tmp_path):
    target = tmp_path / "preset"
    _tiny_backbone(seed=1).save_to_preset(target, max_shard_size=300)
    old_shards = sorted(p.name for p in target.glob("model-*-of-*.safetensors"))
    assert len(old_shards) > 1
    (target / "notes.txt").write_text("keep me")
    (target / ".git").mkdir()
    (target / ".git" / "HEAD").write_text("ref: refs/heads/main\n")

    new_backbone = _tiny_backbone(seed=2)
    new_backbone.save_to_preset(target)

    assert (target / "notes.txt").read_text() == "keep me"
    assert (target / ".git" / "HEAD").read_text() == "ref: refs/heads/main\n"
    assert sorted(target.glob("model-*-of-*.safetensors")) == []
    assert not (target / "model.safetensors.index.json").exists()
    loaded = azk.models.BertBackbone.from_preset(target)
    for ours, theirs in zip(loaded.weights, new_backbone.weights):
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))
    assert _leftovers(tmp_path) == []
    files = json.loads((target / "metadata.json").read_text())["files"]
    assert "notes.txt" not in files and "model.safetensors" in files


def test_a_failed_replacement_keeps_the_old_preset_and_the_user_files(tmp_path, monkeypatch):
    target = tmp_path / "preset"
    _tiny_backbone(seed=1).save_to_preset(target)
    (target / "notes.txt").write_text("keep me")
    before = _snapshot(target)

    from attention_zoo_keras.hub import preset_format

    def failing_save_arrays(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(preset_format, "save_arrays", failing_save_arrays)
    with pytest.raises(OSError, match="disk full"):
        _tiny_backbone(seed=2).save_to_preset(target)

    assert _snapshot(target) == before
    assert _leftovers(tmp_path) == []


@pytest.mark.skipif(not hasattr(os, "symlink"), reason="needs symbolic links")
def test_a_symlinked_preset_stays_a_link_and_leaves_nothing_behind(tmp_path):
    real = tmp_path / "storage" / "preset"
    _tiny_backbone(seed=1).save_to_preset(real)
    links = tmp_path / "links"
    links.mkdir()
    link = links / "preset"
    link.symlink_to(real, target_is_directory=True)

    _tiny_backbone(seed=2).save_to_preset(link)

    assert link.is_symlink() and link.resolve() == real.resolve()
    assert _leftovers(links) == [] and _leftovers(real.parent) == []
    azk.models.BertBackbone.from_preset(link)


@pytest.mark.parametrize("size", [0, -1, "0MB"])
def test_a_shard_size_that_is_not_positive_is_refused(tmp_path, size):
    with pytest.raises(ValueError, match="max_shard_size must be positive"):
        _tiny_backbone().save_to_preset(tmp_path / "preset", max_shard_size=size)
    assert not (tmp_path / "preset").exists()


def test_preset_entries_claims_only_native_presets(tmp_path):
    _tiny_backbone().save_to_preset(tmp_path / "preset")
    (tmp_path / "preset" / "notes.txt").write_text("x")
    assert "model.safetensors" in preset_entries(tmp_path / "preset")
    assert "notes.txt" not in preset_entries(tmp_path / "preset")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.json").write_text("not json")
    assert preset_entries(tmp_path / "other") is None
