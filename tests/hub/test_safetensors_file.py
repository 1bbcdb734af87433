"""The library's own safetensors reader and writer (`hub.safetensors_file`):
files it writes are read by the `safetensors` package and the reverse, every
dtype round-trips bit for bit, the data is aligned so backends can map it
without a copy, and malformed headers are refused with what is wrong."""

import json
import struct

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file
from safetensors.numpy import save_file

from attention_zoo_keras.hub.safetensors_file import ALIGNMENT
from attention_zoo_keras.hub.safetensors_file import read_layout
from attention_zoo_keras.hub.safetensors_file import read_tensor
from attention_zoo_keras.hub.safetensors_file import write_safetensors

# Files, HTTP and error messages: the same code on every backend (scripts/test.sh runs it on torch).
pytestmark = pytest.mark.backend_independent


def _arrays():
    rng = np.random.default_rng(0)
    return {
        "kernel": rng.standard_normal((5, 16)).astype(np.float32),
        "odd": rng.standard_normal(3).astype(np.float32),  # 12 bytes: not a multiple of the alignment
        "half": rng.standard_normal((4, 4)).astype(np.float16),
        "brain": rng.standard_normal((2, 32)).astype(ml_dtypes.bfloat16),
        "float8": rng.standard_normal(64).astype(ml_dtypes.float8_e4m3fn),
        "int8": rng.integers(-128, 127, (3, 7), dtype=np.int8),
        "int64": rng.integers(0, 10**12, 4, dtype=np.int64),
        "flags": np.array([True, False, True]),
        "scalar": np.array(2.5, dtype=np.float32),
        "empty": np.zeros((0, 4), np.float32),
        "transposed": rng.standard_normal((16, 8)).astype(np.float32).T,  # not C-ordered
    }


def _read_all(path):
    data_start, entries = read_layout(path)
    return {key: read_tensor(path, data_start, entry) for key, entry in entries.items()}


def test_every_dtype_round_trips_bit_for_bit(tmp_path):
    path = tmp_path / "model.safetensors"
    arrays = _arrays()
    write_safetensors(path, arrays, metadata={"format": "np"})
    restored = _read_all(path)
    assert sorted(restored) == sorted(arrays)
    for key, array in arrays.items():
        assert restored[key].dtype == array.dtype and restored[key].shape == array.shape, key
        assert restored[key].tobytes() == array.tobytes(), key


def test_the_safetensors_package_reads_what_is_written(tmp_path):
    path = tmp_path / "model.safetensors"
    # The numpy dtypes (safetensors.numpy reads no ml_dtypes ones).
    arrays = {k: v for k, v in _arrays().items() if k not in ("brain", "float8")}
    write_safetensors(path, arrays, metadata={"format": "np"})
    loaded = load_file(str(path))
    for key, array in arrays.items():
        np.testing.assert_array_equal(loaded[key], array, err_msg=key)


def test_files_of_the_safetensors_package_are_read(tmp_path):
    path = tmp_path / "model.safetensors"
    arrays = {"a": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.arange(5, dtype=np.int32)}
    save_file(arrays, str(path))
    restored = _read_all(path)
    for key, array in arrays.items():
        np.testing.assert_array_equal(restored[key], array)


def test_the_data_and_the_tensors_of_aligned_size_start_aligned(tmp_path):
    path = tmp_path / "model.safetensors"
    arrays = _arrays()
    write_safetensors(path, arrays)
    data_start, entries = read_layout(path)
    assert data_start % ALIGNMENT == 0
    aligned = [key for key, array in arrays.items() if array.nbytes and array.nbytes % ALIGNMENT == 0]
    assert len(aligned) == 4
    for key in aligned:
        assert entries[key]["data_offsets"][0] % ALIGNMENT == 0, key
        assert read_tensor(path, data_start, entries[key]).ctypes.data % ALIGNMENT == 0, key


def test_a_read_tensor_is_a_copy_on_write_map(tmp_path):
    path = tmp_path / "model.safetensors"
    write_safetensors(path, {"w": np.ones((4, 16), np.float32)})
    data_start, entries = read_layout(path)
    tensor = read_tensor(path, data_start, entries["w"])
    tensor[0, 0] = 7.0  # stays in this process
    assert read_tensor(path, data_start, entries["w"])[0, 0] == 1.0


def _file(header, data=b""):
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


@pytest.mark.parametrize(
    "content, problem",
    [
        (b"\x01\x02", "fewer than the 8 of a header length"),
        (struct.pack("<Q", 10**6) + b"{}", "header length 1000000 does not fit"),
        (struct.pack("<Q", 4) + b"\xff\xfe{}", "header is not JSON"),
        (_file([1, 2]), "not a JSON object"),
        (_file({"w": {"dtype": "F33", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4), "no known dtype"),
        (_file({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, b"\0" * 4), "not a list of sizes"),
        (_file({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4), "does not hold a F32"),
        (_file({"w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}}, b"\0" * 4), "byte range"),
        (
            _file({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                   "b": {"dtype": "F32", "shape": [1], "data_offsets": [2, 6]}}, b"\0" * 6),
            "gap or overlap at byte 4",
        ),
        (_file({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 7), "need 8 bytes of data"),
    ],
)
def test_a_malformed_file_is_refused_with_the_reason(tmp_path, content, problem):
    path = tmp_path / "model.safetensors"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=problem):
        read_layout(path)
