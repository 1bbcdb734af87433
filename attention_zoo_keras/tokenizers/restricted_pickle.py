"""Reads a vocabulary stored as a pickle, admitting plain data only.

Why this module exists: the Hugging Face Hub's Transformer-XL checkpoint
(`transfo-xl/transfo-xl-wt103`) ships its word vocabulary only as a
pickle: `vocab.pkl` or `vocab.bin`, a dict of the tokenizer's attributes
written by `pickle.dump` or by the legacy `torch.save` (`transformers`
tries the one, then the other). Unpickling runs code. A pickle names
callables as `module.name` globals, which the unpickler imports and calls,
so a crafted file runs `os.system(...)` the moment it is loaded;
`transformers` deprecated the model for that reason and reads these files
only when `TRUST_REMOTE_CODE=True`. This project never unpickles at run time (DESIGN.md: presets hold
safetensors and JSON only). A family's converter reads such a vocabulary
once, through `load_plain_pickle`, and writes `tokenizer.json`, which is
what the preset ships and loads from then on.

How the reader is restricted (see "Restricting Globals" in the `pickle`
documentation):

- `find_class` is the only door through which a pickle gets a callable:
  the `GLOBAL`, `STACK_GLOBAL` and `INST` opcodes, and `OBJ`, `REDUCE`,
  `NEWOBJ` and `BUILD` only call what came through it. Here it is a lookup
  in a fixed table of plain containers: the builtins `dict`, `list`,
  `tuple`, `set`, `frozenset`, `str`, `bytes`, `int`, `float` and `bool`,
  and `collections.OrderedDict` and `collections.Counter`. It imports
  nothing and resolves no dotted names. Any other name is refused with
  `DisallowedPickleError`, which names the global and the file. That
  includes every way a `__reduce__` can hand a callable to `REDUCE`:
  `os.system`, `builtins.eval`, `builtins.getattr`,
  `builtins.__import__`, `subprocess.Popen` and classes of any module.
  Calling an admitted type only builds a container, and none of them has a
  `__setstate__` that `BUILD` could call. `BUILD` sets attributes on
  whatever it is given, so the two `collections` classes are handed out as
  fresh constructor functions rather than as themselves: `Counter` is a
  Python class, whose attributes a pickle could otherwise overwrite for the
  whole process. The builtin types are immutable.
- The opcodes are listed with `pickletools` before anything is loaded.
  Extension codes (`EXT1`, `EXT2`, `EXT4`) are refused: the C unpickler
  answers them from a process-wide cache without asking `find_class`.
  Persistent ids (`PERSID`, `BINPERSID`), which `torch.save` uses for
  tensors, are refused too. A vocabulary has neither.
- `None`, `True`, `False`, numbers, strings, bytes, lists, tuples and dicts
  have opcodes of their own and need no global. The one exception: pickle
  protocols 0 to 2 write `bytes` as `_codecs.encode(text, "latin1")`. That
  name is answered with a function that only turns a string into bytes with
  that one encoding (any other codec is refused: codec lookup imports
  modules).

Two layouts are read: (a) a plain pickle, and (b) the legacy (non-zip)
`torch.save` format of an object without tensors. Format (b) is a run of
pickles: the magic number `0x1950a86a20f9469cfc6c`, the protocol version
(1001), a dict describing the writing system, the object itself, then the
list of tensor storage keys. A zip-format `torch.save` file (PyTorch >= 1.6)
is refused with an error that says how to convert it.

Example:

>>> import pickle, tempfile, os
>>> path = os.path.join(tempfile.mkdtemp(), "vocab.pkl")
>>> with open(path, "wb") as f:
...     pickle.dump({"idx2sym": ["<unk>", "the"], "lower_case": False}, f)
>>> load_plain_pickle(path)
{'idx2sym': ['<unk>', 'the'], 'lower_case': False}
"""

import collections
import io
import pickle
import pickletools

from attention_zoo_keras.hub.source import PresetFileError

TORCH_LEGACY_MAGIC_NUMBER = 0x1950A86A20F9469CFC6C
TORCH_LEGACY_PROTOCOL_VERSION = 1001
ZIP_SIGNATURE = b"PK\x03\x04"

_BUILTINS = {
    "dict": dict,
    "list": list,
    "tuple": tuple,
    "set": set,
    "frozenset": frozenset,
    "str": str,
    "bytes": bytes,
    "int": int,
    "float": float,
    "bool": bool,
}

ALLOWED_GLOBALS = {
    **{("builtins", name): value for name, value in _BUILTINS.items()},
    # Python 2 pickles name the same types through `__builtin__`.
    **{("__builtin__", name): value for name, value in _BUILTINS.items()},
    ("__builtin__", "unicode"): str,
    ("__builtin__", "long"): int,
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("collections", "Counter"): collections.Counter,
}
"""`(module, name)` -> type: all a pickle read here may name (besides
`_codecs.encode`, see the module docstring)."""

_HANDED_OUT_AS_CONSTRUCTORS = {collections.OrderedDict, collections.Counter}


def _constructor(container_type):
    """A new function that builds a `container_type`."""

    def construct(*args, **kwargs):
        return container_type(*args, **kwargs)

    construct.__name__ = container_type.__name__
    return construct


_EXTENSION_OPCODES = {"EXT1", "EXT2", "EXT4"}
_PERSISTENT_ID_OPCODES = {"PERSID", "BINPERSID"}


class DisallowedPickleError(PresetFileError):
    """A pickle names a global that is not plain data: loading it could run
    code, so it is refused.

    Attributes:
        global_name: str or None. The refused `"module.name"`.
        path: str or Path or None. The file.
    """

    def __init__(self, message, global_name=None, path=None):
        super().__init__(message)
        self.global_name = global_name
        self.path = path


def _latin1_encoder(path):
    """A new function standing in for `_codecs.encode`, through which pickle
    protocols 0 to 2 write `bytes`: `text.encode("latin1")`, and nothing
    else."""

    def encode(text, encoding="utf-8", errors="strict"):
        if type(text) is not str or encoding not in ("latin1", "latin-1") or errors != "strict":
            raise DisallowedPickleError(
                f"'{path}' calls _codecs.encode with {type(text).__name__} and encoding {encoding!r}; "
                "only the latin1 encoding of a string into bytes is admitted.",
                global_name="_codecs.encode",
                path=path,
            )
        return text.encode("latin1")

    return encode


class _PlainDataUnpickler(pickle.Unpickler):
    """An unpickler whose `find_class` admits only `ALLOWED_GLOBALS` (and
    `_codecs.encode` for the bytes of old protocols)."""

    def __init__(self, file, path):
        # Python 2 `str` objects are read as UTF-8 text, the encoding a
        # vocabulary's symbols were written in.
        super().__init__(file, encoding="utf-8")
        self._path = path

    def find_class(self, module, name):
        key = (module, name)
        if key in ALLOWED_GLOBALS:
            value = ALLOWED_GLOBALS[key]
            return _constructor(value) if value in _HANDED_OUT_AS_CONSTRUCTORS else value
        if key == ("_codecs", "encode"):
            return _latin1_encoder(self._path)
        global_name = f"{module}.{name}"
        raise DisallowedPickleError(
            f"'{self._path}' asks to load '{global_name}'; refused, because loading a "
            "pickle that names it could run arbitrary code. Only plain data is admitted "
            "here (builtins dict, list, tuple, set, frozenset, str, bytes, int, float, "
            "bool, and collections.OrderedDict and collections.Counter).",
            global_name=global_name,
            path=self._path,
        )

    def persistent_load(self, pid):
        raise DisallowedPickleError(
            f"'{self._path}' refers to persistent objects (as torch.save does for tensors); "
            "only plain data is admitted here.",
            path=self._path,
        )


def _check_opcodes(stream, path):
    """Lists the opcodes of the pickle at `stream`'s position, without
    loading anything, and leaves `stream` after its `STOP`; refuses
    extension codes and persistent ids."""
    for opcode, _, _ in pickletools.genops(stream):
        if opcode.name in _EXTENSION_OPCODES:
            raise DisallowedPickleError(
                f"'{path}' uses the pickle extension registry (opcode {opcode.name}), "
                "which a plain-data pickle never needs; refused.",
                path=path,
            )
        if opcode.name in _PERSISTENT_ID_OPCODES:
            raise DisallowedPickleError(
                f"'{path}' holds persistent references (as torch.save writes for "
                "tensors); only plain data is admitted here.",
                path=path,
            )


def _load_one(data, stream, path):
    """The next pickle of `data`, read from `stream`'s position."""
    start = stream.tell()
    if start >= len(data):
        raise PresetFileError(f"'{path}' ends before the pickle it should hold (truncated).")
    try:
        _check_opcodes(stream, path)
    except DisallowedPickleError:
        raise
    except Exception as error:  # pickletools raises ValueError and others on bad data
        raise PresetFileError(f"'{path}' is not a valid pickle (corrupt or truncated): {error}") from error
    end = stream.tell()
    try:
        return _PlainDataUnpickler(io.BytesIO(data[start:end]), path).load()
    except DisallowedPickleError:
        raise
    except Exception as error:  # UnpicklingError, EOFError, TypeError, ... on bad data
        raise PresetFileError(f"'{path}' is not a valid pickle (corrupt or truncated): {error}") from error


def load_plain_pickle(path):
    """The object in the pickle file `path`, which may hold plain data only.

    Reads a plain pickle or a legacy (non-zip) `torch.save` file without
    tensors. See the module docstring for what "plain" admits and why.

    Args:
        path: str or Path. The file.

    Returns:
        The unpickled object.

    Raises:
        DisallowedPickleError: the file names a global other than the plain
            containers (naming it and the file), or holds tensors.
        PresetFileError: the file is missing or unreadable, is not a pickle,
            is truncated, or is a zip-format `torch.save` file.
    """
    try:
        with open(path, "rb") as file:
            data = file.read()
    except OSError as error:
        raise PresetFileError(f"Cannot read the pickle file '{path}': {error}") from error
    if not data:
        raise PresetFileError(f"'{path}' is empty, not a pickle.")
    if data.startswith(ZIP_SIGNATURE):
        raise PresetFileError(
            f"'{path}' is a zip-format torch.save file (PyTorch 1.6 or later), which is not "
            "supported here. Re-save the object without tensors as a plain pickle "
            "(pickle.dump) or with torch.save(obj, path, _use_new_zipfile_serialization=False), "
            "or build the vocabulary from a list of tokens."
        )
    stream = io.BytesIO(data)
    first = _load_one(data, stream, path)
    if type(first) is not int or first != TORCH_LEGACY_MAGIC_NUMBER:
        return first
    # The legacy torch.save layout: magic number, protocol version, system
    # information, the object, then the keys of the tensor storages.
    protocol = _load_one(data, stream, path)
    if protocol != TORCH_LEGACY_PROTOCOL_VERSION:
        raise PresetFileError(
            f"'{path}' is a legacy torch.save file of protocol version {protocol!r}; "
            f"only version {TORCH_LEGACY_PROTOCOL_VERSION} is known."
        )
    _load_one(data, stream, path)  # system information: endianness, type sizes
    result = _load_one(data, stream, path)
    storage_keys = _load_one(data, stream, path)
    if storage_keys:
        raise DisallowedPickleError(
            f"'{path}' holds tensors; only plain data is admitted here.", path=path
        )
    return result
