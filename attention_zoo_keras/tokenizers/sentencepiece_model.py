"""SentencePiece model files (Kudo & Richardson, 2018), read without the
`sentencepiece` or `protobuf` packages, and unigram models (Kudo, 2018) and
BPE models (Sennrich et al., 2016) as `tokenizers.Tokenizer`s that segment
text as SentencePiece does.

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

A BPE model's pieces come in merge order (scores `0, -1, -2, ...` after the
meta pieces, then the characters). SentencePiece starts from the
characters of the normalized text and, again and again, joins the two
neighbouring symbols whose concatenation is the NORMAL piece of highest
score (the leftmost such pair on a tie), until no pair makes a piece; a
character the model lacks is the unknown piece, and a run of them one
unknown piece. The `tokenizers` BPE model does the same with a ranked list
of merges: each split `left + right` of a piece into two pieces is a
merge, ranked by the piece's score (`fuse_unk` joins the unknown
characters). The splits of one piece get different ranks where
SentencePiece scores them alike (ranked as `transformers` ranks them, the
shorter left part first); that could only change the pieces if two
different splits of one piece were candidates at overlapping places at the
same time (symbols `x`, `y`, `z` with `x + y == y + z`), which a search of
160,000 encodings with random, densely filled BPE vocabularies never met.
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

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED = 1, 2, 3, 4, 5  # piece types
MODEL_TYPES = {1: "UNIGRAM", 2: "BPE", 3: "WORD", 4: "CHAR"}
UNIGRAM, BPE = 1, 2
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
        pieces: tuple of SentencePiece. The vocabulary, in id order.
        model_type: int. 1 UNIGRAM, 2 BPE, 3 WORD, 4 CHAR.
        split_by_whitespace: bool. Pieces never span a space (`▁` only
            starts one).
        byte_fallback: bool. Unknown characters become byte pieces.
        normalizer_name: str. The normalization rule, e.g. `"nmt_nfkc"`.
        precompiled_charsmap: bytes. The compiled normalization rule.
        add_dummy_prefix: bool. A space is put before the text.
        remove_extra_whitespaces: bool. Leading, trailing and repeated
            spaces are removed.
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


def _check_supported(model, model_type):
    """Raises `ValueError` for a model that is not of `model_type` or has a
    feature the `tokenizers` pipelines here cannot reproduce."""
    if model.model_type != model_type:
        name = MODEL_TYPES.get(model.model_type, str(model.model_type))
        expected = "unigram" if model_type == UNIGRAM else MODEL_TYPES[model_type]
        raise ValueError(f"Only {expected} SentencePiece models are supported; this one is {name}.")
    if model.byte_fallback:
        raise ValueError("SentencePiece models with byte fallback are not supported.")
    if any(piece.type == USER_DEFINED for piece in model.pieces):
        raise ValueError("SentencePiece models with user-defined pieces are not supported.")


def _add_text_steps(tokenizer, model):
    """Gives `tokenizer` the model's normalization, its spaces as `▁`, and a
    decoder that turns pieces back into text."""
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


def unigram_tokenizer(model):
    """A `tokenizers.Tokenizer` that segments text into the pieces a unigram
    SentencePiece model gives, with the model's ids.

    Normalization is the model's precompiled rule, then (if the model says
    so) removal of leading, trailing and repeated spaces; spaces become `▁`,
    with one put before the text when `add_dummy_prefix` is set. Its
    decoder turns pieces back into text (the unknown piece as `<unk>`,
    where SentencePiece writes ` ⁇ `).

    Args:
        model: SentencePieceModel. The parsed model file.

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
    _check_supported(model, UNIGRAM)
    lowest = min(piece.score for piece in model.pieces if piece.type == NORMAL)
    # Any segmentation of a piece's text into normal pieces scores at least
    # len(text) * lowest (scores are log-probabilities, so not above 0).
    vocabulary = [
        (piece.piece, piece.score if piece.type == NORMAL else len(piece.piece) * min(lowest, 0.0) - 1.0)
        for piece in model.pieces
    ]
    tokenizer = tokenizers.Tokenizer(models.Unigram(vocabulary, unk_id=model.unknown_id, byte_fallback=False))
    return _add_text_steps(tokenizer, model)


def bpe_merges(model):
    """The merges that rebuild a BPE model's NORMAL pieces, best first:
    every split `(left, right)` of a piece into two NORMAL pieces, ordered by
    the piece's score (highest first; by id on a tie), then by the length
    of `left` (shortest first).

    So a piece holding a character that is no NORMAL piece is never
    produced, where SentencePiece would join the unknown character into it
    (its BPE trainer keeps every character of its pieces as a piece, so
    its models have no such piece).

    >>> model = SentencePieceModel(model_type=BPE, pieces=(
    ...     SentencePiece("<unk>", 0.0, UNKNOWN), SentencePiece("ab", 0.0), SentencePiece("bc", -1.0),
    ...     SentencePiece("abc", -2.0), SentencePiece("a", -3.0), SentencePiece("b", -4.0), SentencePiece("c", -5.0)))
    >>> bpe_merges(model)
    [('a', 'b'), ('b', 'c'), ('a', 'bc'), ('ab', 'c')]
    """
    normal = {piece.piece for piece in model.pieces if piece.type == NORMAL}
    ranked = sorted(
        (index for index, piece in enumerate(model.pieces) if piece.type == NORMAL and len(piece.piece) > 1),
        key=lambda index: (-model.pieces[index].score, index),
    )
    merges = []
    for index in ranked:
        text = model.pieces[index].piece
        merges += [(text[:k], text[k:]) for k in range(1, len(text)) if text[:k] in normal and text[k:] in normal]
    return merges


def bpe_tokenizer(model):
    """A `tokenizers.Tokenizer` that segments text into the pieces a BPE
    SentencePiece model gives, with the model's ids.

    The text steps are those of `unigram_tokenizer`; the subword model is a
    `tokenizers` BPE model whose merges (`bpe_merges`) rebuild the pieces in
    SentencePiece's order, with the unknown piece for characters the model
    lacks (a run of them is one unknown piece, as in SentencePiece). The
    control pieces (`<s>`, `</s>`) keep their ids but, as in SentencePiece,
    are never produced from text: `</s>` written in a text is its five
    characters. The module docstring tells the one rare case where the
    pieces can differ from SentencePiece's.

    Args:
        model: SentencePieceModel. The parsed model file.

    Raises:
        ValueError: for a model this cannot reproduce: not BPE, byte
            fallback, user-defined or unused pieces.

    Example:

    >>> model = SentencePieceModel(model_type=BPE, pieces=(
    ...     SentencePiece("<unk>", 0.0, UNKNOWN), SentencePiece("</s>", 0.0, CONTROL),
    ...     SentencePiece("▁t", -0.0), SentencePiece("he", -1.0), SentencePiece("▁the", -2.0),
    ...     SentencePiece("▁", -3.0), SentencePiece("e", -4.0), SentencePiece("t", -5.0), SentencePiece("h", -6.0)))
    >>> tokenizer = bpe_tokenizer(model)
    >>> tokenizer.encode("the  het ЖЖ").tokens
    ['▁the', '▁', 'he', 't', '▁', '<unk>']
    >>> tokenizer.decode(tokenizer.encode(" the  the ").ids)
    'the the'
    """
    _check_supported(model, BPE)
    if any(piece.type == UNUSED for piece in model.pieces):
        # SentencePiece splits an unused piece it made back into its halves.
        raise ValueError("BPE SentencePiece models with unused pieces are not supported.")
    vocabulary = {piece.piece: index for index, piece in enumerate(model.pieces)}
    if len(vocabulary) != len(model.pieces):
        raise ValueError("The SentencePiece model has a piece twice.")
    bpe = models.BPE(
        vocabulary,
        bpe_merges(model),
        unk_token=model.pieces[model.unknown_id].piece,
        fuse_unk=True,
        byte_fallback=False,
        dropout=None,
    )
    return _add_text_steps(tokenizers.Tokenizer(bpe), model)
