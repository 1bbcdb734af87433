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
import struct
from pathlib import PurePosixPath

import keras
import ml_dtypes
import numpy as np
from safetensors import SafetensorError
from safetensors import safe_open
from safetensors.numpy import save_file

from attention_zoo_keras.backend_support import is_integer_dtype
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
        current[key] = np.require(array, requirements="C")  # keeps a scalar's shape ()
        current_size += array.nbytes
    shards.append(current)
    metadata = {"format": "np"}
    if len(shards) == 1:
        save_file(shards[0], str(directory / WEIGHTS_FILE), metadata=metadata)
        return
    weight_map = {}
    for number, shard in enumerate(shards, start=1):
        name = f"model-{number:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(directory / name), metadata=metadata)
        weight_map.update({key: name for key in shard})
    index = {
        "metadata": {"total_size": int(sum(a.nbytes for a in arrays.values()))},
        "weight_map": weight_map,
    }
    (directory / INDEX_FILE).write_text(json.dumps(index, indent=2))


class Checkpoint:
    """Read access to the tensors of a preset's (possibly sharded) safetensors.

    Args:
        source: a `PresetSource`.

    Tensors are read lazily, one at a time, as numpy arrays mapped from the
    file (copy-on-write); `shape(key)` reads only the file's header. Shard
    names in the index must stay inside the preset.
    """

    # Every read returns a new array that nothing else holds.
    reads_fresh_arrays = True

    def __init__(self, source):
        self.source = source
        self._open_files = {}
        self._layouts = {}
        if source.file(WEIGHTS_FILE) is not None:
            self._file_of_key = {key: WEIGHTS_FILE for key in self._handle(WEIGHTS_FILE).keys()}
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

    def _handle(self, filename):
        if filename not in self._open_files:
            path = self.source.require(filename)
            try:
                self._open_files[filename] = safe_open(str(path), framework="numpy")
            except (SafetensorError, OSError, ValueError) as error:
                raise self.source.unreadable(
                    filename, path, f"is not a readable safetensors file ({error})"
                ) from error
        return self._open_files[filename]

    def keys(self):
        """Every tensor name in the checkpoint."""
        return self._file_of_key.keys()

    def __contains__(self, key):
        return key in self._file_of_key

    def shape(self, key):
        """The shape of tensor `key`, from its file's header (no data read)."""
        filename = self._file_of_key[key]
        try:
            return tuple(self._handle(filename).get_slice(key).get_shape())
        except (SafetensorError, OSError, ValueError) as error:
            raise self._unreadable_tensor(key, filename, error) from error

    def __getitem__(self, key):
        """Tensor `key`, a copy-on-write memory map of its bytes in the file
        (`read_tensor`): nothing is read until used, and each read is a
        mapping of its own, released with the array."""
        filename = self._file_of_key[key]
        self._handle(filename)  # the file was opened and checked by safetensors
        path = self.source.require(filename)
        try:
            if filename not in self._layouts:
                self._layouts[filename] = read_layout(path)
            data_start, entries = self._layouts[filename]
            return read_tensor(path, data_start, entries[key])
        except (OSError, ValueError, KeyError) as error:
            raise self._unreadable_tensor(key, filename, error) from error

    def _unreadable_tensor(self, key, filename, error):
        return self.source.unreadable(
            filename, self.source.require(filename), f"has a tensor '{key}' that cannot be read ({error})"
        )


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


# The safetensors dtype names, as numpy dtypes (ml_dtypes for those numpy lacks).
NUMPY_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
    "F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E5M2": ml_dtypes.float8_e5m2,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8,
    "U64": np.uint64, "U32": np.uint32, "U16": np.uint16, "U8": np.uint8, "BOOL": np.bool_,
}


def read_layout(path):
    """`(offset of the data, {key: header entry})` of a safetensors file.

    The format is an 8-byte little-endian header length, a JSON header giving
    each tensor's dtype, shape and byte range in the data, then the data.
    """
    with open(path, "rb") as file:
        (header_length,) = struct.unpack("<Q", file.read(8))
        header = json.loads(file.read(header_length))
    header.pop("__metadata__", None)
    return 8 + header_length, header


def read_tensor(path, data_start, entry):
    """The tensor a header `entry` describes, read from `path`."""
    if entry["dtype"] not in NUMPY_DTYPES:
        raise ValueError(f"the unsupported dtype {entry['dtype']}")
    dtype = np.dtype(NUMPY_DTYPES[entry["dtype"]])
    shape = tuple(entry["shape"])
    start, end = entry["data_offsets"]
    count = (end - start) // dtype.itemsize
    if count != int(np.prod(shape, dtype=np.int64)) or count * dtype.itemsize != end - start:
        raise ValueError(
            f"its byte range {start}..{end} does not hold a {entry['dtype']} tensor of shape {list(shape)}"
        )
    if not shape or count == 0:  # nothing to map
        array = np.fromfile(path, dtype=dtype, count=count, offset=data_start + start)
        if array.size != count:
            raise ValueError(f"the file ends before its {end - start} bytes")
        return array.reshape(shape)
    # Copy-on-write: pages are read when first used, writes stay in memory.
    return np.memmap(path, dtype=dtype, mode="c", offset=data_start + start, shape=shape).view(np.ndarray)


def check_arrays(variables, arrays, source_description, optional_keys=(), filled=()):
    """Checks that `arrays` holds every key of `variables` (but optional
    ones) with the variable's shape.

    Args:
        variables: `{key: keras.Variable}`.
        arrays: a mapping of keys to arrays (a `Checkpoint` or a dict).
        source_description: named in errors.
        optional_keys: keys that may be missing.
        filled: keys of variables created holding their checkpoint value
            (checked then, see `backend_support.initialized_from`); they are
            not read again.

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
