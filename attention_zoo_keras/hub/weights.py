"""Weights as safetensors: writing (sharded above a size), reading, assigning.

A checkpoint maps stable keys — a variable's path inside its model, such as
`transformer_layer_0/self_attention/query/kernel` — to arrays. Above
`max_shard_size` the weights are split over `model-0000i-of-0000n.safetensors`
files listed by `model.safetensors.index.json`, the layout `transformers` uses.
Nothing here unpickles: safetensors only.
"""

import collections.abc
import json
import re
from pathlib import PurePosixPath

import keras
import numpy as np

from attention_zoo_keras.backend_support import is_integer_dtype
from attention_zoo_keras.hub.safetensors_file import read_layout
from attention_zoo_keras.hub.safetensors_file import read_tensor
from attention_zoo_keras.hub.safetensors_file import write_safetensors
from attention_zoo_keras.hub.source import PresetFileError
from attention_zoo_keras.hub.source import inside

WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
DEFAULT_MAX_SHARD_SIZE = 5_000_000_000


class CheckpointMismatchError(ValueError):
    """A checkpoint's tensors do not fit the model: a variable it lacks, a
    shape that differs, or a tensor that no variable takes."""


def parse_size(size):
    """Bytes in `size`: an int, or a string such as `"500MB"` or `"2GiB"`."""
    if isinstance(size, int):
        return size
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]i?B|B)?\s*", str(size), re.IGNORECASE)
    if not match:
        raise ValueError(f"Cannot read '{size}' as a size; write e.g. 500MB or 2GB.")
    units = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}
    return int(float(match.group(1)) * units[(match.group(2) or "B").lower()])


def variables_by_key(model):
    """`{variable.path: variable}` for every weight of `model`, unique paths,
    less the run-time state a model lists in `unsaved_variables` (such as
    Transformer-XL's memory carried between batches)."""
    unsaved = {id(variable) for variable in getattr(model, "unsaved_variables", ())}
    variables = {}
    for variable in model.weights:
        if id(variable) in unsaved:
            continue
        if variable.path in variables and variables[variable.path] is not variable:
            raise ValueError(f"Two different variables share the path '{variable.path}'.")
        variables[variable.path] = variable
    return variables


def save_arrays(arrays, directory, max_shard_size=DEFAULT_MAX_SHARD_SIZE):
    """Writes `{key: array or variable}` into `directory` as safetensors:
    `model.safetensors`, or shards and their index above `max_shard_size`."""
    arrays = {key: keras.ops.convert_to_numpy(value) for key, value in arrays.items()}
    limit = parse_size(max_shard_size)
    shards, current, current_size = [], {}, 0
    for key, array in arrays.items():
        if current and current_size + array.nbytes > limit:
            shards.append(current)
            current, current_size = {}, 0
        current[key] = array
        current_size += array.nbytes
    shards.append(current)
    metadata = {"format": "np"}
    if len(shards) == 1:
        write_safetensors(directory / WEIGHTS_FILE, shards[0], metadata=metadata)
        return
    weight_map = {}
    for number, shard in enumerate(shards, start=1):
        name = f"model-{number:05d}-of-{len(shards):05d}.safetensors"
        write_safetensors(directory / name, shard, metadata=metadata)
        weight_map.update({key: name for key in shard})
    index = {
        "metadata": {"total_size": int(sum(a.nbytes for a in arrays.values()))},
        "weight_map": weight_map,
    }
    (directory / INDEX_FILE).write_text(json.dumps(index, indent=2))


class Checkpoint:
    """Read access to the tensors of a preset's (possibly sharded) safetensors.

    Args:
        source: PresetSource. Where the preset's files are.

    Tensors are read lazily, one at a time, as numpy arrays mapped from the
    file (copy-on-write, `hub.safetensors_file.read_tensor`); `shape(key)`
    reads only the file's header, which is checked when the file is first
    opened. Shard names in the index must stay inside the preset.
    """

    # Every read returns a new array that nothing else holds.
    reads_fresh_arrays = True

    def __init__(self, source):
        self.source = source
        self._layouts = {}  # {file name: (path, data offset, header entries)}
        if source.file(WEIGHTS_FILE) is not None:
            self._file_of_key = {key: WEIGHTS_FILE for key in self._layout(WEIGHTS_FILE)[2]}
        elif source.file(INDEX_FILE) is not None:
            index = source.json(INDEX_FILE)
            weight_map = index.get("weight_map") if isinstance(index, dict) else None
            if not isinstance(weight_map, dict):
                raise PresetFileError(
                    f"'{INDEX_FILE}' of preset '{source.description}' has no 'weight_map'."
                )
            for key, filename in weight_map.items():
                self._check_shard_name(key, filename)
            self._file_of_key = weight_map
        else:
            raise PresetFileError(
                f"Preset '{source.description}' has no weights: neither '{WEIGHTS_FILE}' "
                f"nor '{INDEX_FILE}' is there. A checkpoint saved only as PyTorch pickles "
                "('pytorch_model.bin') is never unpickled at run time; convert it once with "
                "`azk-convert convert` (it reads it with torch.load(weights_only=True))."
            )

    def _check_shard_name(self, key, filename):
        """Refuses an index entry naming a file outside the preset."""
        where = f"'{INDEX_FILE}' of preset '{self.source.description}'"
        if not isinstance(filename, str) or not filename:
            raise PresetFileError(f"{where} maps '{key}' to {filename!r}, which is not a file name.")
        if self.source.directory is not None:
            outside = inside(self.source.directory, filename) is None
        else:  # a hub repo's file names: no absolute path, no `..`
            outside = PurePosixPath(filename).is_absolute() or ".." in PurePosixPath(filename).parts
        if outside:
            raise PresetFileError(
                f"{where} maps '{key}' to the shard '{filename}', which lies outside the preset "
                "directory; shards must be files of the preset itself, so nothing was loaded."
            )

    def _layout(self, filename):
        """`read_layout` of the file `filename`, read and checked once."""
        if filename not in self._layouts:
            path = self.source.require(filename)
            try:
                self._layouts[filename] = (path, *read_layout(path))
            except (OSError, ValueError) as error:
                raise self.source.unreadable(
                    filename, path, f"is not a readable safetensors file ({error})"
                ) from error
        return self._layouts[filename]

    def _entry(self, key):
        filename = self._file_of_key[key]
        path, data_start, entries = self._layout(filename)
        if key not in entries:
            raise self.source.unreadable(
                filename, path, f"lacks the tensor '{key}' that '{INDEX_FILE}' places in it"
            )
        return path, data_start, entries[key]

    def keys(self):
        """Every tensor name in the checkpoint."""
        return self._file_of_key.keys()

    def __contains__(self, key):
        return key in self._file_of_key

    def shape(self, key):
        """The shape of tensor `key`, from its file's header (no data read)."""
        return tuple(self._entry(key)[2]["shape"])

    def __getitem__(self, key):
        """Tensor `key`, a copy-on-write memory map of its bytes in the file
        (`read_tensor`): nothing is read until used, and each read is a
        mapping of its own, released with the array."""
        path, data_start, entry = self._entry(key)
        try:
            return read_tensor(path, data_start, entry)
        except OSError as error:
            raise self.source.unreadable(
                self._file_of_key[key], path, f"has a tensor '{key}' that cannot be read ({error})"
            ) from error


class TrackedArrays(collections.abc.Mapping):
    """A read-only view of a checkpoint that records which keys were read,
    so a converter's unread source tensors can be named."""

    def __init__(self, arrays):
        self._arrays = arrays
        self.read = set()

    def __getitem__(self, key):
        value = self._arrays[key]
        self.read.add(key)
        return value

    def __contains__(self, key):
        return key in self._arrays

    def __iter__(self):
        return iter(self._arrays.keys())

    def __len__(self):
        return len(self._arrays.keys())


def check_arrays(variables, arrays, source_description, optional_keys=(), filled=()):
    """Checks that `arrays` holds every key of `variables` (but optional
    ones) with the variable's shape.

    Args:
        variables: dict. `{key: keras.Variable}`.
        arrays: mapping. Keys to arrays (a `Checkpoint` or a dict).
        source_description: str. Named in errors.
        optional_keys: collection of str. Keys that may be missing.
        filled: collection of str. Keys of variables created holding their
            checkpoint value (checked then, see
            `backend_support.initialized_from`); they are not read again.

    Returns:
        The sorted keys that are missing but optional.

    Raises:
        CheckpointMismatchError: naming every missing key, or a variable whose
            shape differs from the checkpoint's (with both shapes), or that
            holds floats where the checkpoint has integers (or the reverse).
    """
    missing = sorted(key for key in variables if key not in arrays)
    required_missing = [key for key in missing if key not in optional_keys]
    if required_missing:
        shown = ", ".join(required_missing[:10]) + (" ..." if len(required_missing) > 10 else "")
        raise CheckpointMismatchError(
            f"Checkpoint '{source_description}' lacks {len(required_missing)} weights the "
            f"model needs: {shown}."
        )
    for key, variable in variables.items():
        if key in missing or key in filled:
            continue
        array = arrays[key]
        if tuple(array.shape) != tuple(variable.shape):
            raise CheckpointMismatchError(
                f"Shape mismatch for variable '{key}': the model expects "
                f"{tuple(variable.shape)} but checkpoint '{source_description}' has "
                f"{tuple(array.shape)}. Does the config match the weights?"
            )
        if is_integer_dtype(array.dtype) != is_integer_dtype(variable.dtype):
            raise CheckpointMismatchError(
                f"Dtype mismatch for variable '{key}': the model holds {variable.dtype} but checkpoint "
                f"'{source_description}' has {np.dtype(array.dtype).name}; integers and floats are not "
                "converted into each other (a quantized tensor read as a float weight would compute "
                "garbage). Does the config (its dtype policies) match the weights?"
            )
    return missing


def assign_weights(variables, arrays, source_description, optional_keys=(), filled=()):
    """Assigns `arrays[key]` to `variables[key]` for every key but the
    `filled` ones, after `check_arrays` (same arguments); returns the missing
    optional keys."""
    missing = check_arrays(variables, arrays, source_description, optional_keys, filled)
    for key, variable in variables.items():
        if key not in missing and key not in filled:
            variable.assign(np.asarray(arrays[key], dtype=variable.dtype))
    return missing
