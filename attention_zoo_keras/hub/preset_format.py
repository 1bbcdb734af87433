"""The native preset directory, and reading any preset's config and weights.

A native preset directory holds:

- `config.json`: the registered class and its Keras config (a task's config
  nests its backbone's), plus the library and its version;
- `model.safetensors` (or shards and `model.safetensors.index.json`): weights
  keyed by variable path;
- `preprocessor.json` and `tokenizer.json` (the `tokenizers` format) when a
  preprocessor is attached, with any other file its tokenizer needs (a
  translation tokenizer's target side, say);
- `metadata.json`: versions, the backend it was saved with, parameter count,
  date;
- `README.md`: a model card with Hub metadata.

A backbone preset may also carry task heads (`save_preset_with_heads`):
tensors `heads/<TaskClassName>/<key>` and `"heads"` in `config.json`.

A directory or repo in `transformers` format (`config.json` with
`model_type`) is read through the family's registered converter instead;
`preset_loader` decides which, once per load.
"""

import datetime
import json
from pathlib import Path

import keras

from attention_zoo_keras.hub.atomic import atomic_directory
from attention_zoo_keras.hub.atomic import write_atomically
from attention_zoo_keras.hub.model_card import model_card
from attention_zoo_keras.hub.model_card import with_parity_section
from attention_zoo_keras.hub.model_card import with_source
from attention_zoo_keras.hub.weights import DEFAULT_MAX_SHARD_SIZE
from attention_zoo_keras.hub.weights import INDEX_FILE
from attention_zoo_keras.hub.weights import parse_size
from attention_zoo_keras.hub.weights import save_arrays
from attention_zoo_keras.hub.weights import variables_by_key
from attention_zoo_keras.registration import PACKAGE
from attention_zoo_keras.registration import serialize
from attention_zoo_keras.version import __version__

CONFIG_FILE = "config.json"
METADATA_FILE = "metadata.json"
PREPROCESSOR_FILE = "preprocessor.json"
TOKENIZER_FILE = "tokenizer.json"
VOCABULARY_FILE = "vocab.json"  # a translation tokenizer's shared vocabulary
MODEL_CARD_FILE = "README.md"
HEADS_KEY = "heads"
HEAD_PREPROCESSOR_KEY = "preprocessor"  # in a head's entry: its own preprocessor settings

# The files a preset saved before `metadata.json` listed its files may hold.
_PRESET_FILE_NAMES = {
    CONFIG_FILE, METADATA_FILE, PREPROCESSOR_FILE, TOKENIZER_FILE, VOCABULARY_FILE, MODEL_CARD_FILE, INDEX_FILE,
}


def is_native(config):
    """Whether a parsed `config.json` was written by this library."""
    return isinstance(config, dict) and config.get("library") == PACKAGE


def _write_json(path, data):
    path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n", encoding="utf-8")


def preset_entries(directory):
    """The names in `directory` that a save of a preset owns (and may
    replace), or `None` if `directory` is not a native preset.

    A preset lists the files it wrote in `metadata.json`; for one saved
    before that list existed, its own files are recognised by name.
    """
    directory = Path(directory)
    try:
        config = json.loads((directory / CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not is_native(config):
        return None
    try:
        files = json.loads((directory / METADATA_FILE).read_text(encoding="utf-8")).get("files")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        files = None
    if isinstance(files, list) and all(isinstance(name, str) for name in files):
        return set(files) | {CONFIG_FILE, METADATA_FILE}
    return {
        entry.name
        for entry in directory.iterdir()
        if entry.name in _PRESET_FILE_NAMES or entry.name.endswith((".safetensors", "tokenizer.json"))
    }


def staged_preset(directory):
    """`atomic_directory` for a preset: yields a staging directory that
    replaces `directory` when the block succeeds. `directory` must be
    missing, empty, or a native preset; files in it that a preset does not
    own (a user's notes, `.git`) are kept."""
    return atomic_directory(directory, owned_entries=preset_entries)


def save_preset(model, directory, preprocessor=None, family=None, max_shard_size=DEFAULT_MAX_SHARD_SIZE):
    """Writes `model` (and `preprocessor`) as a native preset, atomically.

    If anything fails, `directory` keeps whatever it held before. A
    directory that is neither empty nor a native preset is refused
    (`DirectoryNotReplaceableError`) without being touched.
    """
    if parse_size(max_shard_size) <= 0:
        raise ValueError(f"max_shard_size must be positive; got {max_shard_size!r}.")
    with staged_preset(directory) as staging:
        _write_preset_files(staging, model, preprocessor, family, max_shard_size)


def _write_preset_files(staging, model, preprocessor, family, max_shard_size, heads=None, head_arrays=None):
    """Writes every file of a native preset of `model` into `staging`: the
    config (with `heads`, task arguments by class name, when given), the
    weights (with `head_arrays`, keyed `heads/<class>/<key>`), the
    preprocessor's files, the model card and `metadata.json` listing them."""
    config = {"library": PACKAGE, "library_version": __version__, **serialize(model)}
    if heads:
        config[HEADS_KEY] = heads
    _write_json(staging / CONFIG_FILE, config)
    save_arrays({**variables_by_key(model), **(head_arrays or {})}, staging, max_shard_size=max_shard_size)
    if preprocessor is not None:
        write_preprocessor_files(preprocessor, staging)
    parameter_count = int(model.count_params()) + sum(int(v.size) for v in (head_arrays or {}).values())
    (staging / MODEL_CARD_FILE).write_text(
        model_card(type(model).__name__, family or "", parameter_count, model.get_config()),
        encoding="utf-8",
    )
    _write_json(
        staging / METADATA_FILE,
        {
            "library": PACKAGE,
            "library_version": __version__,
            "keras_version": keras.__version__,
            "saved_with_backend": keras.backend.backend(),
            "class_name": type(model).__name__,
            "parameter_count": parameter_count,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "files": sorted({entry.name for entry in staging.iterdir()} | {METADATA_FILE}),
        },
    )


def save_preset_with_heads(
    backbone, tasks, directory, preprocessor=None, head_preprocessor_settings=None,
    max_shard_size=DEFAULT_MAX_SHARD_SIZE,
):
    """Writes `backbone` as a native preset that also carries the heads of
    `tasks`, atomically (as `save_preset`).

    One preset then serves every task: `<TaskClass>.from_preset(directory)`
    builds that task with its saved arguments (keyword arguments override
    them) and loads its head, while `from_preset` of the backbone or of a
    task not saved here loads the backbone alone. The head of task `T` is
    stored as the tensors `heads/T/<key>` (`key` the path of a variable of
    `T` that is not its backbone's) and its constructor arguments (less
    `backbone`, `preprocessor`, `name`, `trainable`) as
    `config.json["heads"]["T"]`. Why: a checkpoint trained with several heads
    (ViLBERT's multi-task model) converts once, not once per head.

    Args:
        backbone: Backbone. The shared backbone.
        tasks: list of Task. Tasks built on that very backbone object, at
            most one per class.
        directory: str or Path. The preset directory (missing, empty, or a
            native preset).
        preprocessor: Preprocessor or None. Saved with the preset, if given.
        head_preprocessor_settings: dict or None. `{task class name:
            {setting: value}}`, preprocessor settings that differ by head (a
            ViLBERT head's `task_id`): stored as
            `config.json["heads"]["T"]["preprocessor"]`,
            they override the saved preprocessor's when `T.from_preset`
            builds its preprocessor.
        max_shard_size: int or str. As in `save_preset` (bytes, or a
            size such as `"500MB"`).

    Raises:
        ValueError: a task is built on another backbone, or two tasks share
            a class.

    Example:

    >>> classifier = BertTextClassifier(backbone, num_classes=2)       # doctest: +SKIP
    >>> save_preset_with_heads(backbone, [classifier, BertMaskedLM(backbone)], "./bert")  # doctest: +SKIP
    >>> BertTextClassifier.from_preset("./bert")  # the saved head      # doctest: +SKIP
    """
    if parse_size(max_shard_size) <= 0:
        raise ValueError(f"max_shard_size must be positive; got {max_shard_size!r}.")
    head_preprocessor_settings = dict(head_preprocessor_settings or {})
    unknown = sorted(set(head_preprocessor_settings) - {type(task).__name__ for task in tasks})
    if unknown:
        raise ValueError(f"head_preprocessor_settings names tasks not saved here: {', '.join(unknown)}.")
    backbone_keys = set(variables_by_key(backbone))
    heads, head_arrays = {}, {}
    for task in tasks:
        name = type(task).__name__
        if getattr(task, "backbone", None) is not backbone:
            raise ValueError(f"The {name} passed to save_preset_with_heads is not built on the backbone given.")
        if name in heads:
            raise ValueError(f"save_preset_with_heads got two {name} tasks; a preset holds one head per task class.")
        config = serialize(task)["config"]
        heads[name] = {key: value for key, value in config.items() if key not in ("backbone", "preprocessor", "name", "trainable")}
        if name in head_preprocessor_settings:
            heads[name][HEAD_PREPROCESSOR_KEY] = dict(head_preprocessor_settings[name])
        for key, variable in variables_by_key(task).items():
            if key not in backbone_keys:
                head_arrays[f"{HEADS_KEY}/{name}/{key}"] = keras.ops.convert_to_numpy(variable)
    with staged_preset(directory) as staging:
        _write_preset_files(
            staging, backbone, preprocessor, getattr(backbone, "family", None), max_shard_size,
            heads=heads, head_arrays=head_arrays,
        )


def _update_preset_record(directory, key, value, update_card):
    """Sets `metadata.json[key] = value` in a saved native preset and
    rewrites its model card with `update_card(card)`; each file is replaced
    atomically."""
    directory = Path(directory)
    metadata_path = directory / METADATA_FILE
    metadata = json.loads(metadata_path.read_text(encoding="utf-8")) if metadata_path.is_file() else {}
    metadata[key] = value
    write_atomically(metadata_path, lambda path: _write_json(Path(path), metadata))
    card_path = directory / MODEL_CARD_FILE
    card = update_card(card_path.read_text(encoding="utf-8") if card_path.is_file() else "")
    write_atomically(card_path, lambda path: Path(path).write_text(card, encoding="utf-8"))


def record_parity(directory, parity):
    """Records a verification against the reference implementation in a
    saved native preset: `metadata.json` gets (or has replaced) its
    `"parity"` entry, and the model card its "Parity" section."""
    _update_preset_record(directory, "parity", parity, lambda card: with_parity_section(card, parity))


def record_source(directory, source, license_name=None, description=None):
    """Records the checkpoint a saved native preset was converted from
    (`"source"` in `metadata.json`; `base_model`, `license` and a "Source"
    section with `description` in the model card)."""
    _update_preset_record(
        directory, "source", source, lambda card: with_source(card, source, license_name, description)
    )


def write_preprocessor_files(preprocessor, directory):
    """`preprocessor.json`, and its tokenizer's files (`tokenizer.json`, ...)
    if it has a tokenizer, into `directory`."""
    _write_json(
        directory / PREPROCESSOR_FILE,
        {"library": PACKAGE, "library_version": __version__, **serialize(preprocessor)},
    )
    if preprocessor.tokenizer is not None:
        preprocessor.tokenizer.save(directory)
