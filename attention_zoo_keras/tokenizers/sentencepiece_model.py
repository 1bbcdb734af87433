"""SentencePiece model files (Kudo & Richardson, 2018), read without the
`sentencepiece` or `protobuf` packages, and unigram models (Kudo, 2018) as
`tokenizers.Tokenizer`s that segment text as SentencePiece does.

A `.model` / `.spm` file is a serialized `sentencepiece.ModelProto`
(`sentencepiece_model.proto`). The fields read here:

    ModelProto       1: repeated SentencePiece pieces
                     2: TrainerSpec trainer_spec
                     3: NormalizerSpec normalizer_spec
    SentencePiece    1: string piece   2: float score
                     3: enum type (1 NORMAL, 2 UNKNOWN, 3 CONTROL,
                        4 USER_DEFINED, 5 UNUSED, 6 BYTE)
    TrainerSpec      3: enum model_type (1 UNIGRAM, 2 BPE, 3 WORD, 4 CHAR)
                    22: bool split_by_whitespace (default true)
                    35: bool byte_fallback
    NormalizerSpec   1: string name   2: bytes precompiled_charsmap
                     3: bool add_dummy_prefix (default true)
                     4: bool remove_extra_whitespaces (default true)

SentencePiece segments the normalized text by Viterbi over NORMAL pieces
only, scoring a character no piece covers `min(NORMAL scores) - 10` (the
unknown piece). The `tokenizers` Unigram model searches every piece of its
vocabulary, so the pieces SentencePiece never emits (unknown, control,
unused) get a score below that of any segmentation of their text into
normal pieces. One difference remains: `tokenizers` takes the unknown
score from the lowest score of all pieces, so a text spelling such a piece
with a character the model lacks (`<s>` where `<` is unknown) comes out as
that piece, where SentencePiece gives unknown pieces.
"""

import dataclasses
import struct

import tokenizers
from tokenizers import Regex
from tokenizers import decoders
from tokenizers import models
from tokenizers import normalizers
from tokenizers import pre_tokenizers

from attention_zoo_keras.hub.source import PresetFileError

NORMAL, UNKNOWN, CONTROL, USER_DEFINED = 1, 2, 3, 4  # piece types
MODEL_TYPES = {1: "UNIGRAM", 2: "BPE", 3: "WORD", 4: "CHAR"}
UNIGRAM = 1
WHITESPACE = "▁"  # U+2581, SentencePiece's escaped space

_VARINT, _FIXED64, _LENGTH_DELIMITED, _FIXED32 = 0, 1, 2, 5


class _CorruptProto(ValueError):
    """The bytes are not a well-formed protobuf message."""


@dataclasses.dataclass(frozen=True)
class SentencePiece:
    """One vocabulary entry: its text, log-probability score and type."""

    piece: str
    score: float
    type: int = NORMAL


@dataclasses.dataclass(frozen=True)
class SentencePieceModel:
    """What a SentencePiece model file holds that segmentation needs.

    Attributes:
        pieces: the vocabulary, in id order.
        model_type: 1 UNIGRAM, 2 BPE, 3 WORD, 4 CHAR.
        split_by_whitespace: pieces never span a space (`▁` only starts one).
        byte_fallback: unknown characters become byte pieces.
        normalizer_name: the normalization rule, e.g. `"nmt_nfkc"`.
        precompiled_charsmap: the compiled normalization rule.
        add_dummy_prefix: a space is put before the text.
        remove_extra_whitespaces: leading, trailing and repeated spaces are
            removed.
    """

    pieces: tuple
    model_type: int = UNIGRAM
    split_by_whitespace: bool = True
    byte_fallback: bool = False
    normalizer_name: str = ""
    precompiled_charsmap: bytes = b""
    add_dummy_prefix: bool = True
    remove_extra_whitespaces: bool = True

    @property
    def unknown_id(self):
        """Id of the unknown piece."""
        return next(index for index, piece in enumerate(self.pieces) if piece.type == UNKNOWN)


def _read_varint(data, position):
    value = 0
    for shift in range(0, 70, 7):
        if position >= len(data):
            raise _CorruptProto("it ends inside a varint")
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, position
    raise _CorruptProto("a varint is longer than 10 bytes")


def _fields(data):
    """`(field number, wire type, value)` of each field of a message: an int
    for varints, the raw bytes otherwise."""
    position = 0
    while position < len(data):
        key, position = _read_varint(data, position)
        number, wire_type = key >> 3, key & 7
        if number == 0:
            raise _CorruptProto("a field has number 0")
        if wire_type == _VARINT:
            value, position = _read_varint(data, position)
        elif wire_type in (_FIXED32, _FIXED64, _LENGTH_DELIMITED):
            if wire_type == _LENGTH_DELIMITED:
                size, position = _read_varint(data, position)
            else:
                size = 4 if wire_type == _FIXED32 else 8
            if position + size > len(data):
                raise _CorruptProto(f"field {number} runs past the end of its message")
            value = bytes(data[position : position + size])
            position += size
        else:
            raise _CorruptProto(f"field {number} has the unknown wire type {wire_type}")
        yield number, wire_type, value


def _expect(number, wire_type, expected):
    if wire_type != expected:
        raise _CorruptProto(f"field {number} has wire type {wire_type}, expected {expected}")


def _text(number, value):
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as error:
        raise _CorruptProto(f"field {number} is not UTF-8 text") from error


def _parse_piece(data):
    piece, score, piece_type = None, 0.0, NORMAL
    for number, wire_type, value in _fields(data):
        if number == 1:
            _expect(number, wire_type, _LENGTH_DELIMITED)
            piece = _text(number, value)
        elif number == 2:
            _expect(number, wire_type, _FIXED32)
            score = struct.unpack("<f", value)[0]
        elif number == 3:
            _expect(number, wire_type, _VARINT)
            piece_type = value
    if not piece:
        raise _CorruptProto("a piece has no text")
    return SentencePiece(piece, score, piece_type)


def _parse_spec(data, fields):
    """`{name: value}` of the varint, string and bytes fields named in
    `fields` (`{number: (name, kind)}`, kind `int`, `bool`, `str` or `bytes`)."""
    settings = {}
    for number, wire_type, value in _fields(data):
        if number not in fields:
            continue
        name, kind = fields[number]
        if kind in (int, bool):
            _expect(number, wire_type, _VARINT)
            settings[name] = kind(value)
        else:
            _expect(number, wire_type, _LENGTH_DELIMITED)
            settings[name] = _text(number, value) if kind is str else value
    return settings


_TRAINER_FIELDS = {3: ("model_type", int), 22: ("split_by_whitespace", bool), 35: ("byte_fallback", bool)}
_NORMALIZER_FIELDS = {
    1: ("normalizer_name", str),
    2: ("precompiled_charsmap", bytes),
    3: ("add_dummy_prefix", bool),
    4: ("remove_extra_whitespaces", bool),
}


def _parse_model(data):
    """A `SentencePieceModel` from the bytes of a model file.

    Raises:
        ValueError: if the bytes are not a complete SentencePiece model.
    """
    pieces, settings, seen = [], {}, set()
    for number, wire_type, value in _fields(data):
        if number not in (1, 2, 3):
            continue
        _expect(number, wire_type, _LENGTH_DELIMITED)
        seen.add(number)
        if number == 1:
            pieces.append(_parse_piece(value))
        else:
            settings.update(_parse_spec(value, _TRAINER_FIELDS if number == 2 else _NORMALIZER_FIELDS))
    # A file cut between two fields still parses; the specs come after the pieces.
    if not {2, 3} <= seen:
        raise _CorruptProto("it lacks the trainer or normalizer spec (is it truncated?)")
    if sum(piece.type == UNKNOWN for piece in pieces) != 1 or not any(piece.type == NORMAL for piece in pieces):
        raise _CorruptProto("it does not have exactly one unknown piece and some normal ones")
    return SentencePieceModel(pieces=tuple(pieces), **settings)


def read_sentencepiece_model(path):
    """The `SentencePieceModel` in a `.model` / `.spm` file.

    Raises:
        PresetFileError: naming the file, if it is missing or corrupt.
    """
    try:
        with open(path, "rb") as file:
            data = file.read()
    except OSError as error:
        raise PresetFileError(f"Cannot read the SentencePiece model '{path}': {error}") from error
    try:
        return _parse_model(data)
    except _CorruptProto as error:
        raise PresetFileError(f"'{path}' is not a valid SentencePiece model: {error}.") from error


def unigram_tokenizer(model):
    """A `tokenizers.Tokenizer` that segments text into the pieces a unigram
    SentencePiece model gives, with the model's ids.

    Normalization is the model's precompiled rule, then (if the model says
    so) removal of leading, trailing and repeated spaces; spaces become `▁`,
    with one put before the text when `add_dummy_prefix` is set. Its
    decoder turns pieces back into text (the unknown piece as `<unk>`,
    where SentencePiece writes ` ⁇ `).

    Args:
        model: a `SentencePieceModel`.

    Raises:
        ValueError: for a model this cannot reproduce: not unigram, byte
            fallback, or user-defined pieces.

    Example:

    >>> model = SentencePieceModel(pieces=(
    ...     SentencePiece("<unk>", 0.0, UNKNOWN), SentencePiece("▁a", -1.0),
    ...     SentencePiece("▁", -2.0), SentencePiece("b", -2.0), SentencePiece("▁ab", -2.5)))
    >>> tokenizer = unigram_tokenizer(model)
    >>> tokenizer.encode("  a ab  b").tokens
    ['▁a', '▁ab', '▁', 'b']
    >>> tokenizer.decode([1, 4, 2, 3])
    'a ab b'
    """
    if model.model_type != UNIGRAM:
        name = MODEL_TYPES.get(model.model_type, str(model.model_type))
        raise ValueError(f"Only unigram SentencePiece models are supported; this one is {name}.")
    if model.byte_fallback:
        raise ValueError("SentencePiece models with byte fallback are not supported.")
    if any(piece.type == USER_DEFINED for piece in model.pieces):
        raise ValueError("SentencePiece models with user-defined pieces are not supported.")
    lowest = min(piece.score for piece in model.pieces if piece.type == NORMAL)
    # Any segmentation of a piece's text into normal pieces scores at least
    # len(text) * lowest (scores are log-probabilities, so not above 0).
    vocabulary = [
        (piece.piece, piece.score if piece.type == NORMAL else len(piece.piece) * min(lowest, 0.0) - 1.0)
        for piece in model.pieces
    ]
    tokenizer = tokenizers.Tokenizer(models.Unigram(vocabulary, unk_id=model.unknown_id, byte_fallback=False))
    steps = []
    if model.precompiled_charsmap:
        steps.append(normalizers.Precompiled(model.precompiled_charsmap))
    if model.remove_extra_whitespaces:
        steps += [normalizers.Replace(Regex(r"\A +| +\z"), ""), normalizers.Replace(Regex(" {2,}"), " ")]
    tokenizer.normalizer = normalizers.Sequence(steps)
    prepend_scheme = "always" if model.add_dummy_prefix else "never"
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement=WHITESPACE, prepend_scheme=prepend_scheme, split=model.split_by_whitespace
    )
    tokenizer.decoder = decoders.Metaspace(
        replacement=WHITESPACE, prepend_scheme=prepend_scheme, split=model.split_by_whitespace
    )
    return tokenizer
