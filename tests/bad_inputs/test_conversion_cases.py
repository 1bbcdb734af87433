"""Bad inputs to the conversion tools (`azk-convert`) and the errors they
get: a table of cases, each run by `test_bad_input`."""

import argparse
import json
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch

from attention_zoo_keras.conversion import command_arguments
from attention_zoo_keras.conversion import verified_conversion
from attention_zoo_keras.conversion import vilbert
from attention_zoo_keras.conversion import vilbert_conversion
from attention_zoo_keras.conversion.state_dict import load_torch_file
from attention_zoo_keras.hub.atomic import DirectoryNotReplaceableError
from attention_zoo_keras.hub.source import PresetFileError
from attention_zoo_keras.hub.weights import TrackedArrays
from attention_zoo_keras.models.bert import BertBackbone

# No message may pass on torch's advice to unpickle an untrusted file anyway.
NO_UNSAFE_ADVICE = r"^(?![\s\S]*(weights_only=False|set to `False`|safe_globals))[\s\S]*"


class Payload:
    """A class named by a pickled checkpoint."""


def _file(tmp_path, name, content):
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif isinstance(content, str):
        path.write_text(content)
    else:
        torch.save(content, path)
    return path


def _folder_with_notes(tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("keep me")
    return folder


def _vilbert_into(dest):
    """`azk-convert vilbert` into `dest` (the checkpoint need not exist: `dest` is checked first)."""
    arguments = argparse.Namespace(checkpoint="missing.bin", config="missing.json", dest=str(dest), vocab=None,
                                   task="vqa", task_id=None, sequence_length=None, max_regions=None)
    return vilbert.run(arguments)


def _without(module, call):
    with mock.patch.dict(sys.modules, {module: None}):  # `import module` fails, as when it is not installed
        return call()


CASES = [
    ("bin_names_a_python_object",
     lambda tmp: load_torch_file(_file(tmp, "model.bin", {"weight": torch.zeros(2), "payload": Payload()})),
     PresetFileError, NO_UNSAFE_ADVICE + r"holds the Python object `[\w.]*Payload`, so it was not loaded"),
    ("bin_is_another_pickle",
     lambda tmp: load_torch_file(_file(tmp, "model.bin", b"garbage" * 8)),
     PresetFileError, NO_UNSAFE_ADVICE + r"model\.bin' holds data that is not tensors, so it was not loaded"),
    ("bin_is_truncated",
     lambda tmp: load_torch_file(_file(tmp, "model.bin", b"")),
     PresetFileError, r"model\.bin' is not a PyTorch checkpoint that can be read \(EOFError in torch\.load\)"),
    ("bin_is_foreign_bytes",
     lambda tmp: load_torch_file(_file(tmp, "model.bin", b"\x86garbage" * 8)),
     PresetFileError, r"model\.bin' is not a PyTorch checkpoint that can be read \(IndexError in torch\.load\)"),
    ("bin_holds_a_list_not_a_state_dict",
     lambda tmp: load_torch_file(_file(tmp, "model.bin", [torch.zeros(2)])),
     PresetFileError, r"model\.bin' does not hold a state_dict \(a dict of tensors\)"),
    ("bin_without_torch_installed",
     lambda tmp: _without("torch", lambda: load_torch_file(tmp / "model.bin")),
     ImportError, r"needs torch, which is not installed: pip install 'attention_zoo_keras\[torch\]'"),
    ("convert_out_is_a_folder_of_the_user",
     lambda tmp: verified_conversion.convert_one(str(tmp / "no_checkpoint"), BertBackbone, _folder_with_notes(tmp)),
     DirectoryNotReplaceableError, r"mine'.*not empty \(notes\.txt\) and is not a preset"),
    ("vilbert_dest_is_a_folder_of_the_user",
     lambda tmp: _vilbert_into(_folder_with_notes(tmp)),
     DirectoryNotReplaceableError, r"mine'.*not empty \(notes\.txt\) and is not a preset"),
    ("convert_a_vilbert_preset",
     lambda tmp: command_arguments.resolve_conversion("vilbert_multitask", None),
     command_arguments.UsageError, r"'vilbert_multitask' is not converted here: .*azk-convert vilbert CHECKPOINT CONFIG DEST"),
    ("vilbert_two_heads_of_one_class",
     lambda tmp: vilbert_conversion.choose_tasks(["vqa", "gqa"], {}),
     vilbert_conversion.ConversionError, r"--task vqa and gqa are heads of one class \(ViLBERTVisualQuestionAnswerer\)"),
    ("vilbert_checkpoint_without_heads",
     lambda tmp: vilbert_conversion.choose_tasks(None, {"bert.embeddings.word_embeddings.weight": None}),
     vilbert_conversion.ConversionError, r"holds none of the heads this port converts \(cls, vil_prediction, "),
    ("vilbert_config_not_json",
     lambda tmp: vilbert.read_authors_config(_file(tmp, "config.json", "{vocab_size: 3")),
     vilbert_conversion.ConversionError, r"config '.*config\.json' is not valid JSON"),
    ("vilbert_config_not_an_object",
     lambda tmp: vilbert.read_authors_config(_file(tmp, "config.json", json.dumps([1, 2]))),
     vilbert_conversion.ConversionError, r"config '.*config\.json' holds a JSON list, not the authors' BertConfig"),
    ("vilbert_checkpoint_without_word_embeddings",
     lambda tmp: vilbert_conversion.build(["vqa"], TrackedArrays({}), {}),
     vilbert_conversion.ConversionError, r"no 'bert\.embeddings\.word_embeddings\.weight'; it is not a ViLBERT checkpoint"),
]


@pytest.mark.parametrize(("case_id", "call", "error", "message"), CASES, ids=[case[0] for case in CASES])
def test_bad_input(case_id, call, error, message, tmp_path):
    with pytest.raises(error, match=message):
        call(tmp_path)
    for folder in [path for path in tmp_path.iterdir() if path.name == "mine"]:
        assert [path.name for path in folder.iterdir()] == ["notes.txt"], case_id
    assert not [path for path in Path(tmp_path).iterdir() if path.name.startswith(".")], case_id
