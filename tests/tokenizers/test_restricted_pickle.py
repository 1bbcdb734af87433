"""The plain-data pickle reader: what it reads, what it refuses, and that
refusing runs nothing."""

import collections
import os
import pickle
import subprocess
import sys

import pytest

from attention_zoo_keras.hub.source import PresetFileError
from attention_zoo_keras.tokenizers.restricted_pickle import DisallowedPickleError
from attention_zoo_keras.tokenizers.restricted_pickle import load_plain_pickle

VOCABULARY = {
    "special": ["<eos>"],
    "min_freq": 0,
    "max_size": None,
    "lower_case": False,
    "delimiter": None,
    "counter": collections.Counter({"the": 5, "cat": 2, "naïve": 1}),
    "idx2sym": ["<eos>", "<unk>", "the", "cat", "naïve"],
    "sym2idx": collections.OrderedDict([("<eos>", 0), ("<unk>", 1), ("the", 2), ("cat", 3), ("naïve", 4)]),
    "eos_idx": 0,
    "extras": (1.5, True, b"bytes", {1, 2}, frozenset({"a"}), [None]),
}


def _write(path, data):
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_plain_data_round_trips(tmp_path, protocol):
    path = _write(tmp_path / "vocab.pkl", pickle.dumps(VOCABULARY, protocol=protocol))
    loaded = load_plain_pickle(path)
    assert loaded == VOCABULARY
    assert type(loaded["counter"]) is collections.Counter
    assert type(loaded["sym2idx"]) is collections.OrderedDict
    assert list(loaded["sym2idx"]) == VOCABULARY["idx2sym"]


def test_python_2_names_of_builtins_are_read(tmp_path):
    # Protocol 2 with fix_imports writes `__builtin__.set`, as Python 2 did.
    data = pickle.dumps({"s": {1, 2}}, protocol=2, fix_imports=True)
    assert b"__builtin__" in data
    assert load_plain_pickle(_write(tmp_path / "py2.pkl", data)) == {"s": {1, 2}}


class _Marker:
    """A payload whose unpickling would create a file."""

    def __init__(self, path):
        self.path = path

    def __setstate__(self, state):  # pragma: no cover - must never run
        open(state["path"], "w").close()


class _ReduceTo:
    """Pickles as a call of `function(*arguments)`."""

    def __init__(self, function, *arguments):
        self.function = function
        self.arguments = arguments

    def __reduce__(self):
        return self.function, self.arguments


def _payloads(marker):
    """(pickle bytes, name that must be refused): each would create
    `marker` if it were loaded by `pickle.load`."""
    command = f"touch {marker}"
    return [
        # Hand-written protocol 0, naming os.system as such.
        (f"cos\nsystem\n(V{command}\ntR.".encode(), "os.system"),
        # What __reduce__ gives (os.system pickles as posix.system on POSIX).
        (pickle.dumps(_ReduceTo(os.system, command), protocol=2), f"{os.system.__module__}.system"),
        (pickle.dumps(_ReduceTo(eval, f"open({str(marker)!r}, 'w')"), protocol=4), "builtins.eval"),
        (pickle.dumps(_ReduceTo(exec, f"open({str(marker)!r}, 'w')")), "builtins.exec"),
        (pickle.dumps(_ReduceTo(subprocess.Popen, ["touch", str(marker)])), "subprocess.Popen"),
        # getattr(os, "system")("touch ...") as a pickle would spell it.
        (b"cbuiltins\ngetattr\n(cos\nsystem\nS'__call__'\ntR(V" + command.encode() + b"\ntR.", "builtins.getattr"),
        (pickle.dumps(_Marker(str(marker))), f"{__name__}._Marker"),
        # The INST opcode of protocol 0 instantiates module.name(*args).
        (f"(V{command}\nios\nsystem\n.".encode(), "os.system"),
        # Protocol 4 resolves dotted names: `dict.fromkeys` is not `dict`.
        (b"\x80\x04\x8c\x08builtins\x8c\x0ddict.fromkeys\x93]\x85R.", "builtins.dict.fromkeys"),
        (b"cbuiltins\n__import__\n(Vos\ntR.", "builtins.__import__"),
        (b"ccopyreg\n_reconstructor\n(ccollections\nOrderedDict\ncbuiltins\ndict\n(dtR.", "copyreg._reconstructor"),
    ]


@pytest.mark.parametrize("index", range(11))
def test_globals_other_than_plain_containers_are_refused_and_nothing_runs(tmp_path, index):
    marker = tmp_path / "pwned"
    data, name = _payloads(marker)[index]
    path = _write(tmp_path / "evil.pkl", data)
    with pytest.raises(DisallowedPickleError) as raised:
        load_plain_pickle(path)
    assert name in str(raised.value) and str(path) in str(raised.value)
    assert raised.value.global_name == name
    assert not marker.exists()


def test_the_payloads_do_run_under_plain_pickle(tmp_path):
    """The refused payloads are real: `pickle.loads` runs them."""
    marker = tmp_path / "pwned"
    data, _ = _payloads(marker)[2]  # builtins.eval
    pickle.loads(data)
    assert marker.exists()


def test_named_modules_are_never_imported(tmp_path):
    names = ["this", "attention_zoo_keras_no_such_module"]
    assert not any(name in sys.modules for name in names)
    for name in names:
        path = _write(tmp_path / f"{name}.pkl", f"c{name}\nanything\n.".encode())
        with pytest.raises(DisallowedPickleError, match=f"{name}.anything"):
            load_plain_pickle(path)
    assert not any(name in sys.modules for name in names)


def test_extension_codes_and_persistent_ids_are_refused(tmp_path):
    ext = _write(tmp_path / "ext.pkl", b"\x80\x02\x82\x01.")
    with pytest.raises(DisallowedPickleError, match="extension registry"):
        load_plain_pickle(ext)
    persistent = _write(tmp_path / "persid.pkl", b"\x80\x02X\x01\x00\x00\x00xQ.")
    with pytest.raises(DisallowedPickleError, match="persistent"):
        load_plain_pickle(persistent)


def test_legacy_torch_save_of_plain_data_is_read(tmp_path):
    torch = pytest.importorskip("torch")
    path = tmp_path / "vocab.bin"
    torch.save(VOCABULARY, path, _use_new_zipfile_serialization=False)
    assert path.read_bytes()[:1] == b"\x80"  # a pickle, not a zip archive
    loaded = load_plain_pickle(path)
    assert loaded == VOCABULARY
    assert type(loaded["sym2idx"]) is collections.OrderedDict


def test_legacy_torch_save_with_tensors_is_refused(tmp_path):
    torch = pytest.importorskip("torch")
    path = tmp_path / "tensors.bin"
    torch.save({"weights": torch.zeros(3)}, path, _use_new_zipfile_serialization=False)
    with pytest.raises(DisallowedPickleError, match=str(path)):
        load_plain_pickle(path)


def test_zip_torch_save_is_not_supported(tmp_path):
    torch = pytest.importorskip("torch")
    path = tmp_path / "vocab.bin"
    torch.save(VOCABULARY, path)
    with pytest.raises(PresetFileError, match="zip-format torch.save") as raised:
        load_plain_pickle(path)
    assert str(path) in str(raised.value)
    assert not isinstance(raised.value, DisallowedPickleError)


def test_truncated_legacy_torch_file_names_the_file(tmp_path):
    torch = pytest.importorskip("torch")
    path = tmp_path / "vocab.bin"
    torch.save(VOCABULARY, path, _use_new_zipfile_serialization=False)
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(PresetFileError, match=str(path)):
        load_plain_pickle(path)


@pytest.mark.parametrize(
    "data",
    [
        pickle.dumps(VOCABULARY, protocol=2)[:-40],  # truncated
        pickle.dumps(VOCABULARY, protocol=0)[:-3],  # truncated before STOP
        b"this is not a pickle at all",
        b"\x80\x05\xff\xff garbage",
        b"",
    ],
    ids=["truncated", "truncated-protocol-0", "text", "bad-opcode", "empty"],
)
def test_files_that_are_not_pickles_name_the_file(tmp_path, data):
    path = _write(tmp_path / "broken.pkl", data)
    with pytest.raises(PresetFileError) as raised:
        load_plain_pickle(path)
    assert str(path) in str(raised.value)
    assert not isinstance(raised.value, DisallowedPickleError)


def test_missing_file_names_the_file(tmp_path):
    with pytest.raises(PresetFileError, match="missing.pkl"):
        load_plain_pickle(tmp_path / "missing.pkl")


def test_old_protocols_write_bytes_through_codecs_encode_with_latin1_only(tmp_path):
    data = pickle.dumps({"raw": b"\x00\xffabc"}, protocol=2)
    assert b"_codecs" in data
    assert load_plain_pickle(_write(tmp_path / "bytes.pkl", data)) == {"raw": b"\x00\xffabc"}
    for encoding in ["rot13", "utf-8", "zlib_codec"]:
        evil = f"c_codecs\nencode\n(Vabc\nV{encoding}\ntR.".encode()
        with pytest.raises(DisallowedPickleError, match=encoding):
            load_plain_pickle(_write(tmp_path / "codec.pkl", evil))
    not_a_string = b"c_codecs\nencode\n((tVlatin1\ntR."
    with pytest.raises(DisallowedPickleError, match="tuple"):
        load_plain_pickle(_write(tmp_path / "codec.pkl", not_a_string))


def test_build_cannot_change_the_admitted_classes(tmp_path):
    # BUILD with a slot state sets attributes on the object below it; aimed at
    # the class collections.Counter it would patch it for the whole process.
    payload = b"ccollections\nCounter\n(N}Vmost_common\nI1\nstb."
    before = collections.Counter.most_common
    try:
        load_plain_pickle(_write(tmp_path / "build.pkl", payload))
    except PresetFileError:
        pass
    assert collections.Counter.most_common is before
    assert collections.Counter({"a": 2}).most_common() == [("a", 2)]
    with pytest.raises(PresetFileError):
        load_plain_pickle(_write(tmp_path / "build.pkl", b"cbuiltins\ndict\n(N}Vx\nI1\nstb."))
    assert not hasattr(dict, "x")
