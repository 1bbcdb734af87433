"""The tokenizers of the Reformer checkpoints (Kitaev et al., 2020).

- `ReformerTokenizer`: the SentencePiece model of
  `google/reformer-crime-and-punishment` (`spiece.model`, 320 pieces), a
  BPE model. Its ids (in `transformers`' Reformer tokenizer tests) show
  it: single characters (`▁` 258, `!` 287, `(` 319) come after the merged
  pieces, at the end of the vocabulary, which is how SentencePiece lays
  out a BPE model (a unigram model orders all pieces by score), and
  `transformers.ReformerTokenizer` builds a `tokenizers` BPE model from
  the file. Pieces and ids are SentencePiece's, read from the file without
  the `sentencepiece` package; `<unk>` is 0 and `</s>` is the file's
  `</s>` piece (2 in SentencePiece's default layout).
- `ReformerByteTokenizer`: the bytes of `google/reformer-enwik8`, whose ids
  are the UTF-8 bytes of the text plus 2, with `<pad>` 0 and `<EOS>` 1 (the
  reserved ids of tensor2tensor's `ByteTextEncoder`, which made the enwik8
  data the model was trained on). The model card encodes
  `[byte + 2 for byte in text.encode()]` and decodes `chr(id - 2)` for each
  id above 1, which turns a character of two or more UTF-8 bytes into as
  many wrong characters ("é" into "Ã©"); this tokenizer decodes the bytes
  as UTF-8, as `ByteTextEncoder` does. (The card's `encode` also sizes its
  batch by the longest text's characters, not bytes, so it fails on a text
  with more bytes than that.)

Both are `tokenizers.Tokenizer`s underneath, so both save as `tokenizer.json`.
"""

import tokenizers
from tokenizers import decoders
from tokenizers import models
from tokenizers import pre_tokenizers

from attention_zoo_keras.tokenizers.sentencepiece_model import BPE
from attention_zoo_keras.tokenizers.sentencepiece_model import MODEL_TYPES
from attention_zoo_keras.tokenizers.sentencepiece_model import UNIGRAM
from attention_zoo_keras.tokenizers.sentencepiece_model import bpe_tokenizer
from attention_zoo_keras.tokenizers.sentencepiece_model import read_sentencepiece_model
from attention_zoo_keras.tokenizers.sentencepiece_model import unigram_tokenizer
from attention_zoo_keras.tokenizers.tokenizer import Tokenizer
from attention_zoo_keras.tokenizers.tokenizer import read_tokenizer_json

END_TOKEN = "</s>"
UNKNOWN_TOKEN = "<unk>"
START_TOKEN = "<s>"

BYTE_PAD_TOKEN = "<pad>"
BYTE_END_TOKEN = "<EOS>"
BYTE_OFFSET = 2  # ids 0 and 1 are <pad> and <EOS>; byte b is id b + 2


class ReformerTokenizer(Tokenizer):
    """The SentencePiece tokenizer of `google/reformer-crime-and-punishment`:
    text to SentencePiece pieces and their ids, with the special tokens
    `</s>` (end of a text) and `<unk>` (a character the model lacks; a run
    of them is one `<unk>`).

    Build it from a SentencePiece model file with
    `ReformerTokenizer.from_sentencepiece` (BPE models, as the checkpoint's,
    and unigram ones), or from a `tokenizer.json` written by `save` with
    `ReformerTokenizer.from_file`. The ids are those of
    `sentencepiece.SentencePieceProcessor.encode`: the text is normalized
    by the rules the file holds (SentencePiece's defaults: NFKC, and
    leading, trailing and repeated spaces dropped), and the pieces are
    SentencePiece's. The control pieces (`<s>`, `</s>`) are never read from text: `</s>` written
    in a text is its characters, as in SentencePiece. No `</s>` is
    appended; the original has no padding token.

    `transformers.ReformerTokenizer` (5.x) gives the same ids except where
    it departs from SentencePiece: a text ending in a space gets a last `▁`
    piece there, and `<s>`, `</s>` and `<unk>` written in a text are those
    tokens. `decode` writes the text it writes.

    Args:
        tokenizer: `tokenizers.Tokenizer`. Its vocabulary holds `</s>` and
            `<unk>`.

    Example:

    >>> from attention_zoo_keras.tokenizers.sentencepiece_model import (
    ...     BPE, CONTROL, UNKNOWN, SentencePiece, SentencePieceModel, bpe_tokenizer)
    >>> model = SentencePieceModel(model_type=BPE, pieces=(
    ...     SentencePiece("<unk>", 0.0, UNKNOWN), SentencePiece("<s>", 0.0, CONTROL),
    ...     SentencePiece("</s>", 0.0, CONTROL), SentencePiece("▁t", -0.0), SentencePiece("he", -1.0),
    ...     SentencePiece("▁the", -2.0), SentencePiece("▁", -3.0), SentencePiece("e", -4.0),
    ...     SentencePiece("t", -5.0), SentencePiece("h", -6.0)))
    >>> tokenizer = ReformerTokenizer(bpe_tokenizer(model))
    >>> tokenizer.encode(["the  het", "the Ж"])
    [[5, 6, 4, 8], [5, 6, 0]]
    >>> tokenizer.decode([5, 6, 4, 8, tokenizer.end_token_id])
    'the het'
    >>> tokenizer.end_token_id, tokenizer.special_token_ids
    (2, (2, 0))
    """

    def __init__(self, tokenizer):
        super().__init__(tokenizer)
        for token in (END_TOKEN, UNKNOWN_TOKEN):
            if self.backend.token_to_id(token) is None:
                raise ValueError(
                    f"A Reformer SentencePiece vocabulary needs the token '{token}', which this one lacks."
                )
        self.end_token_id = self.token_to_id(END_TOKEN)
        self.unknown_token_id = self.token_to_id(UNKNOWN_TOKEN)
        skipped = (self.backend.token_to_id(token) for token in (END_TOKEN, UNKNOWN_TOKEN, START_TOKEN))
        self._skipped_ids = frozenset(token_id for token_id in skipped if token_id is not None)

    @property
    def special_token_ids(self):
        """Ids of `</s>` and `<unk>`."""
        return (self.end_token_id, self.unknown_token_id)

    @classmethod
    def from_file(cls, path):
        """Reads a `tokenizer.json`: a `ReformerByteTokenizer` if it lays out
        the enwik8 byte ids, otherwise a `ReformerTokenizer` (so a preset of
        either Reformer checkpoint loads with this class)."""
        backend = read_tokenizer_json(path)
        if _is_byte_layout(backend):
            return ReformerByteTokenizer(backend)
        return cls(backend)

    @classmethod
    def from_sentencepiece(cls, path):
        """From a SentencePiece model file (`spiece.model`), read without the
        `sentencepiece` package.

        Raises:
            PresetFileError: if the file is missing or not a SentencePiece model.
            ValueError: naming the file, if the model is neither BPE nor
                unigram, has a feature the `tokenizers` pipeline cannot
                reproduce (byte fallback, user-defined or unused pieces), or
                lacks `</s>`.
        """
        model = read_sentencepiece_model(path)
        builders = {BPE: bpe_tokenizer, UNIGRAM: unigram_tokenizer}
        if model.model_type not in builders:
            name = MODEL_TYPES.get(model.model_type, str(model.model_type))
            raise ValueError(f"'{path}': only BPE and unigram SentencePiece models are supported; this one is {name}.")
        try:
            return cls(builders[model.model_type](model))
        except ValueError as error:
            raise ValueError(f"'{path}': {error}") from error

    def decode(self, ids, skip_special_tokens=True):
        """Text of a list of ids, spaces restored and the one before the
        text dropped.

        `</s>`, `<s>` and `<unk>` are left out, or with
        `skip_special_tokens=False` written as themselves (SentencePiece
        leaves out `</s>` and `<s>` and writes `<unk>` as ` ⁇ `).
        """
        ids = [int(i) for i in ids]
        if skip_special_tokens:
            ids = [i for i in ids if i not in self._skipped_ids]
        return self.backend.decode(ids, skip_special_tokens=False)


def _bytes_to_unicode():
    """`{byte: character}` of the `tokenizers` ByteLevel pre-tokenizer (GPT-2's
    table): printable Latin-1 bytes are themselves, the others are shifted to
    characters from U+0100 on."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [byte for byte in range(256) if byte not in printable]
    table = {byte: chr(byte) for byte in printable}
    table.update({byte: chr(256 + index) for index, byte in enumerate(others)})
    return table


def byte_tokenizer():
    """A `tokenizers.Tokenizer` giving the id `byte + 2` to each UTF-8 byte
    of a text, with `<pad>` 0 and `<EOS>` 1 in its vocabulary (never produced
    from text), and decoding ids back to bytes and then UTF-8 text.

    The ByteLevel pre-tokenizer writes each byte as one character, and a
    BPE model without merges maps each character to its id.

    >>> byte_tokenizer().encode("Aé").ids
    [67, 197, 171]
    """
    vocabulary = {BYTE_PAD_TOKEN: 0, BYTE_END_TOKEN: 1}
    vocabulary.update({character: byte + BYTE_OFFSET for byte, character in _bytes_to_unicode().items()})
    tokenizer = tokenizers.Tokenizer(models.BPE(vocabulary, [], dropout=None, fuse_unk=False, byte_fallback=False))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def _is_byte_layout(backend):
    """Whether a `tokenizers.Tokenizer` has `byte_tokenizer`'s ids."""
    expected = {BYTE_PAD_TOKEN: 0, BYTE_END_TOKEN: 1, "A": ord("A") + BYTE_OFFSET}
    found = {token: backend.token_to_id(token) for token in expected}
    return found == expected and backend.get_vocab_size(with_added_tokens=True) == 256 + BYTE_OFFSET


class ReformerByteTokenizer(Tokenizer):
    """The byte-level scheme of `google/reformer-enwik8`: the id of each UTF-8
    byte of a text is the byte plus 2; 0 is `<pad>` and 1 is `<EOS>` (end
    of a text).

    `encode` gives the ids of the model card's `encode`
    (`[byte + 2 for byte in text.encode()]`, before its padding). `decode`
    turns ids above 1 back into bytes and decodes them as UTF-8 (an invalid
    sequence becomes U+FFFD), where the model card's `chr(id - 2)` would
    make one character of each byte. It is a `tokenizers.Tokenizer`
    underneath (ByteLevel pre-tokenizer and decoder, no merges), so it saves
    as `tokenizer.json` and reads back with `ReformerByteTokenizer.from_file`.

    Args:
        tokenizer: `tokenizers.Tokenizer` or None. Laid out as
            `byte_tokenizer` builds it; `None` (the default) builds one.

    Example:

    >>> tokenizer = ReformerByteTokenizer()
    >>> tokenizer.encode(["Hi", "né"])
    [[74, 107], [112, 197, 171]]
    >>> tokenizer.decode([112, 197, 171, tokenizer.end_token_id, tokenizer.pad_token_id])
    'né'
    >>> tokenizer.vocabulary_size, tokenizer.special_token_ids
    (258, (0, 1))
    """

    def __init__(self, tokenizer=None):
        super().__init__(byte_tokenizer() if tokenizer is None else tokenizer)
        if not _is_byte_layout(self.backend):
            raise ValueError(
                "The tokenizer does not lay out the Reformer byte ids (<pad> 0, <EOS> 1, byte b at b + 2, "
                "258 ids); build it with ReformerByteTokenizer() instead."
            )
        self.pad_token_id = 0
        self.end_token_id = 1

    @property
    def special_token_ids(self):
        """Ids of `<pad>` and `<EOS>`."""
        return (self.pad_token_id, self.end_token_id)

    def decode(self, ids, skip_special_tokens=True):
        """Text of a list of ids: the bytes `id - 2` decoded as UTF-8.

        `<pad>` and `<EOS>` are left out, or with
        `skip_special_tokens=False` written as themselves.

        Raises:
            ValueError: for an id outside 0..257.
        """
        ids = [int(i) for i in ids]
        outside = [i for i in ids if not 0 <= i < 256 + BYTE_OFFSET]
        if outside:
            raise ValueError(f"Token id {outside[0]} is outside the byte vocabulary (0..{255 + BYTE_OFFSET}).")
        if skip_special_tokens:
            ids = [i for i in ids if i >= BYTE_OFFSET]
        return self.backend.decode(ids, skip_special_tokens=False)
