"""What the `azk-convert` commands take, checked before any work: a named
preset or a checkpoint source with the class to build, and a native preset
directory; a mistake is a `UsageError` (exit code 2).
"""

import json
from pathlib import Path

from attention_zoo_keras.hub.catalog import UnknownPresetError
from attention_zoo_keras.hub.catalog import get_preset
from attention_zoo_keras.hub.preset_format import is_native
from attention_zoo_keras.hub.source import HF_PREFIX
from attention_zoo_keras.hub.source import PresetSource
from attention_zoo_keras.registration import registered_class

# Families whose named presets are not converted from a `transformers`
# checkpoint, and how they are made instead.
CONVERTED_BY_THEIR_OWN_SCRIPT = {
    "vilbert": "its source is the native preset converted from the ViLBERT authors' checkpoint (not in "
    "transformers format): run azk-convert vilbert CHECKPOINT CONFIG DEST [--vocab VOCAB]",
}


class UsageError(Exception):
    """A command-line mistake: reported on stderr with exit code 2."""


def looks_like_source(text):
    """Whether `text` is a checkpoint source (`hf://...` or a path) rather
    than a preset name.

    Args:
        text: str. What the user gave as PRESET_OR_SRC.
    """
    return text.startswith(HF_PREFIX) or PresetSource._looks_like_path(text)


def resolve_conversion(preset_or_src, class_name):
    """`(handle, model class, catalog entry or None)` for `convert`.

    Args:
        preset_or_src: str. A named preset, `hf://org/repo[@revision]` or a
            local directory in `transformers` format.
        class_name: str or None. The class to build (`--class`); a named
            preset says it itself.

    Raises:
        UsageError: an unknown preset or class, a preset not converted
            here, a source without `--class`, or a missing directory.
    """
    entry = None
    if not looks_like_source(preset_or_src):
        try:
            entry = get_preset(preset_or_src)
        except UnknownPresetError as error:
            raise UsageError(str(error)) from error
        if entry["family"] in CONVERTED_BY_THEIR_OWN_SCRIPT:
            how = CONVERTED_BY_THEIR_OWN_SCRIPT[entry["family"]]
            raise UsageError(f"'{preset_or_src}' is not converted here: {how}.")
        class_name = class_name or entry["class_name"]
    elif class_name is None:
        raise UsageError(
            f"'{preset_or_src}' is a checkpoint source, not a named preset: pass --class to say which "
            "class to build (e.g. --class BertBackbone, --class GPTCausalLM, --class ViTImageClassifier, "
            "--class TransformerSeq2SeqLM)."
        )
    elif not preset_or_src.startswith("hf://") and not Path(preset_or_src).expanduser().is_dir():
        raise UsageError(f"source directory '{preset_or_src}' does not exist.")
    try:
        model_cls = registered_class(class_name, source="--class")
    except Exception as error:  # UnregisteredClassError: lists close names
        raise UsageError(str(error)) from error
    return preset_or_src, model_cls, entry


def native_config(directory):
    """The `config.json` of a native preset directory, or a `UsageError`.

    Args:
        directory: str or Path. What should be a native preset.
    """
    directory = Path(directory)
    path = directory / "config.json"
    if not directory.is_dir():
        raise UsageError(f"'{directory}' is not a directory.")
    if not path.is_file():
        raise UsageError(f"'{directory}' is not a native attention_zoo_keras preset: it has no config.json.")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise UsageError(f"'{path}' is not valid JSON: {error}") from error
    if not is_native(config):
        raise UsageError(
            f"'{directory}' is not a native attention_zoo_keras preset (its config.json was not written by "
            "this library; a transformers checkpoint is converted first: azk-convert convert)."
        )
    return config

