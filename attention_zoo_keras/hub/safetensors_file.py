"""The safetensors file format, read and written here without a copy.

A file is an 8-byte little-endian header length `N`, `N` bytes of JSON
header, then the data: `{"__metadata__": {str: str}, key: {"dtype": "F32",
"shape": [...], "data_offsets": [start, end]}, ...}`, each tensor's bytes
(C order, little-endian) at `[start, end)` of the data, which the tensors
cover without gaps or overlaps.

Reading maps each tensor as its own copy-on-write memory map: nothing is
read until used, and nothing is copied where a backend can use the mapping
as it is. `write_safetensors` starts the data at a multiple of
`ALIGNMENT` bytes and puts tensors whose sizes are multiples of it first, so
that (for the weights of any real model, whose rows are multiples of 64
bytes) every tensor starts aligned, and JAX's CPU client takes the mapping
as its buffer without copying (`jax.device_put`), as torch does
(`torch.from_numpy`).
"""

import json
import os
import struct

import ml_dtypes
import numpy as np

# The byte alignment of the data and of every tensor whose size allows it.
ALIGNMENT = 64
# A header longer than this is no safetensors header (safetensors' own limit).
MAX_HEADER_BYTES = 100_000_000

# The safetensors dtype names, as numpy dtypes (ml_dtypes for those numpy lacks).
NUMPY_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
    "F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E5M2": ml_dtypes.float8_e5m2,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8,
    "U64": np.uint64, "U32": np.uint32, "U16": np.uint16, "U8": np.uint8, "BOOL": np.bool_,
}
_DTYPE_NAMES = {np.dtype(dtype): name for name, dtype in NUMPY_DTYPES.items()}


def write_safetensors(path, arrays, metadata=None):
    """Writes `{key: numpy array}` to `path` as safetensors, the data and
    (where their sizes allow) the tensors aligned to `ALIGNMENT` bytes.

    Raises:
        ValueError: an array's dtype has no safetensors name.
    """
    arrays = {key: np.require(array, requirements="C") for key, array in arrays.items()}
    for key, array in arrays.items():
        if array.dtype not in _DTYPE_NAMES:
            raise ValueError(f"Tensor '{key}' has the dtype {array.dtype}, which safetensors cannot store.")
    # Tensors of aligned sizes first, so each of them starts aligned.
    order = sorted(arrays, key=lambda key: arrays[key].nbytes % ALIGNMENT != 0)
    header, offset = {}, 0
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for key in order:
        array = arrays[key]
        header[key] = {"dtype": _DTYPE_NAMES[array.dtype], "shape": list(array.shape),
                       "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % ALIGNMENT)  # spaces: the format's padding
    with open(path, "wb") as file:
        file.write(struct.pack("<Q", len(text)))
        file.write(text)
        for key in order:
            file.write(arrays[key].reshape(-1).view(np.uint8))


def read_layout(path):
    """`(offset of the data, {key: header entry})` of a safetensors file,
    after checking that the header is well formed and that the tensors'
    byte ranges cover the data exactly.

    Raises:
        ValueError: saying what is wrong (a truncated file, a header that is
            no JSON object, an unknown dtype, a byte range that does not fit).
    """
    size = os.path.getsize(path)
    with open(path, "rb") as file:
        prefix = file.read(8)
        if len(prefix) < 8:
            raise ValueError(f"it has {size} bytes, fewer than the 8 of a header length")
        (header_length,) = struct.unpack("<Q", prefix)
        if header_length > min(size - 8, MAX_HEADER_BYTES):
            raise ValueError(f"its header length {header_length} does not fit in its {size} bytes")
        try:
            header = json.loads(file.read(header_length))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise ValueError(f"its header is not JSON ({error})") from None
    if not isinstance(header, dict):
        raise ValueError("its header is not a JSON object")
    header.pop("__metadata__", None)
    data_start = 8 + header_length
    ranges = []
    for key, entry in header.items():
        _check_entry(key, entry)
        ranges.append(tuple(entry["data_offsets"]))
    covered = 0
    for start, end in sorted(ranges):
        if start != covered:
            raise ValueError(f"its tensors leave a gap or overlap at byte {covered} of the data")
        covered = end
    if covered != size - data_start:
        raise ValueError(f"its tensors need {covered} bytes of data, but it holds {size - data_start}")
    return data_start, header


def _check_entry(key, entry):
    if not isinstance(entry, dict) or entry.get("dtype") not in NUMPY_DTYPES:
        raise ValueError(f"tensor '{key}' has no known dtype ({entry!r})")
    shape, offsets = entry.get("shape"), entry.get("data_offsets")
    if not isinstance(shape, list) or not all(isinstance(n, int) and n >= 0 for n in shape):
        raise ValueError(f"tensor '{key}' has the shape {shape!r}, not a list of sizes")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(n, int) for n in offsets)
            and 0 <= offsets[0] <= offsets[1]):
        raise ValueError(f"tensor '{key}' has the byte range {offsets!r}")
    itemsize = np.dtype(NUMPY_DTYPES[entry["dtype"]]).itemsize
    if offsets[1] - offsets[0] != itemsize * int(np.prod(shape, dtype=np.int64)):
        raise ValueError(
            f"tensor '{key}': its byte range {offsets[0]}..{offsets[1]} does not hold a {entry['dtype']} "
            f"tensor of shape {shape}"
        )


def read_tensor(path, data_start, entry):
    """The tensor a checked header `entry` describes: a copy-on-write memory
    map of its bytes in `path` (pages are read when first used; writes stay
    in this process), or a small array read at once where there is nothing
    to map."""
    dtype = np.dtype(NUMPY_DTYPES[entry["dtype"]])
    shape = tuple(entry["shape"])
    start, _ = entry["data_offsets"]
    if not shape or 0 in shape:
        count = int(np.prod(shape, dtype=np.int64))
        return np.fromfile(path, dtype=dtype, count=count, offset=data_start + start).reshape(shape)
    return np.memmap(path, dtype=dtype, mode="c", offset=data_start + start, shape=shape).view(np.ndarray)

