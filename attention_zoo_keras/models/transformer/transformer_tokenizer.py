"""The tokenizer of a translation model: one SentencePiece unigram model
(Kudo, 2018) for the source language, one for the target, and one id space
both share, as Marian MT (Junczys-Dowmunt et al., 2018) and the OPUS-MT
checkpoints (`Helsinki-NLP/opus-mt-*`) lay them out: `source.spm`,
`target.spm` and `vocab.json`.

A text becomes pieces by its side's SentencePiece model, and pieces become
ids by the shared `{piece: id}` vocabulary (a piece it lacks is `<unk>`), as
in `transformers.MarianTokenizer`. The ids cannot be laid out inside the
`tokenizers` models themselves: a unigram model searches every piece of its
vocabulary, so the other side's pieces would change the segmentation.

A model trained from scratch can use characters instead of SentencePiece
pieces (`TransformerTokenizer.from_characters`): one id per character, the
same on both sides.
"""

import json
import re
from pathlib import Path

import tokenizers
from tokenizers import Regex
from tokenizers import decoders
from tokenizers import models
from tokenizers import pre_tokenizers

from attention_zoo_keras.hub.preset_format import TOKENIZER_FILE
from attention_zoo_keras.hub.preset_format import VOCABULARY_FILE
from attention_zoo_keras.hub.source import PresetFileError
from attention_zoo_keras.tokenizers.sentencepiece_model import WHITESPACE
from attention_zoo_keras.tokenizers.sentencepiece_model import read_sentencepiece_model
from attention_zoo_keras.tokenizers.sentencepiece_model import unigram_tokenizer
from attention_zoo_keras.tokenizers.tokenizer import Tokenizer
from attention_zoo_keras.tokenizers.tokenizer import checked_texts
from attention_zoo_keras.tokenizers.tokenizer import read_tokenizer_json
from attention_zoo_keras.tokenizers.tokenizer import required_file
from attention_zoo_keras.hub.atomic import write_atomically

END_TOKEN = "</s>"
UNKNOWN_TOKEN = "<unk>"
PAD_TOKEN = "<pad>"
SPECIAL_TOKENS = (END_TOKEN, UNKNOWN_TOKEN, PAD_TOKEN)
TARGET_TOKENIZER_FILE = "target_tokenizer.json"
# Marian's SentencePiece models, kept as they came so that the tokenizer can
# be written back out as `transformers.MarianTokenizer` reads it.
SENTENCEPIECE_FILES = ("source.spm", "target.spm")

_SPECIAL_TOKEN_SPLIT = re.compile("(" + "|".join(re.escape(token) for token in SPECIAL_TOKENS) + ")")


def split_language_code(text):
    """`(code, rest)`: a Marian language code such as `>>fr<<` at the very
    start of `text` (`None` if there is none) and the text after it.

    Multilingual Marian models read the target language from this token.

    >>> split_language_code(">>fr<< Hello")
    ('>>fr<<', ' Hello')
    >>> split_language_code("Hello >>fr<<")
    (None, 'Hello >>fr<<')
    """
    if text.startswith(">>"):
        end = text.find("<<")
        if end != -1:
            return text[: end + 2], text[end + 2 :]
    return None, text


def _read_vocabulary(path):
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise PresetFileError(f"'{path}' is not a readable vocabulary JSON file: {error}") from error


def _character_tokenizer(vocabulary):
    """A `tokenizers.Tokenizer` that cuts text into single characters (code
    points) and looks each up in `vocabulary` (`<unk>` if absent)."""
    tokenizer = tokenizers.Tokenizer(models.WordLevel(vocabulary, unk_token=UNKNOWN_TOKEN))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    return tokenizer


def _sentencepiece_tokenizer(path):
    try:
        return unigram_tokenizer(read_sentencepiece_model(path))
    except ValueError as error:
        raise ValueError(f"'{path}': {error}") from error


class TransformerTokenizer(Tokenizer):
    """Source and target tokenizers (SentencePiece models, or characters)
    over one shared vocabulary, with the special tokens `</s>` (end of a
    sequence), `<unk>` and `<pad>`.

    `encode` reads source texts, `encode_target` target texts, `decode`
    writes target text. With Marian's files, both sides give the ids
    `transformers.MarianTokenizer` gives (without the `</s>` it appends):
    the special tokens are matched in the text first; a language code
    `>>xx<<` at the start of a text (or right after a special token) is one
    token; the rest is cut into pieces by the side's SentencePiece model,
    and each piece looked up in the vocabulary (`<unk>` if absent). `MarianTokenizer` sets up `sacremoses`'
    punctuation normalizer when that package is installed; this tokenizer has
    none (and `MarianTokenizer.tokenize` does not apply it either, as of
    `transformers` 5).

    Build it from Marian's files with `TransformerTokenizer.from_marian` or,
    for a model trained from scratch, with one id per character by
    `TransformerTokenizer.from_characters`. Saved as `tokenizer.json` (the
    source side) and `target_tokenizer.json` (the target side), both in the
    `tokenizers` format (Marian's with SentencePiece's own ids), and
    `vocab.json` (the shared ids), with Marian's `source.spm` and
    `target.spm` where it was built from them; read back with `from_source`.

    Args:
        tokenizer: `tokenizers.Tokenizer`. The source side.
        target_tokenizer: `tokenizers.Tokenizer`. The target side.
        vocabulary: dict of str to int. `{piece: id}` with ids `0..n-1`,
            holding the special tokens.
        sentencepiece_models: tuple of two bytes, or None. The source and
            target SentencePiece model files the sides were read from
            (`from_marian`), written beside them by `save`.

    Example:

    >>> from attention_zoo_keras.tokenizers.sentencepiece_model import (
    ...     SentencePiece, SentencePieceModel, UNKNOWN, unigram_tokenizer)
    >>> spm = unigram_tokenizer(SentencePieceModel(pieces=(
    ...     SentencePiece("<unk>", 0.0, UNKNOWN), SentencePiece("▁a", -1.0), SentencePiece("▁b", -1.0))))
    >>> vocabulary = {"</s>": 0, "<unk>": 1, "▁b": 2, "▁a": 3, ">>fr<<": 4, "<pad>": 5}
    >>> tokenizer = TransformerTokenizer(spm, spm, vocabulary)
    >>> tokenizer.encode([">>fr<< a b c"])
    [[4, 3, 2, 1]]
    >>> tokenizer.decode([3, 2, 0, 5])
    'a b'
    >>> tokenizer.end_token_id, tokenizer.pad_token_id
    (0, 5)
    """

    def __init__(self, tokenizer, target_tokenizer, vocabulary, sentencepiece_models=None):
        super().__init__(tokenizer)
        self.sentencepiece_models = sentencepiece_models
        self.target_backend = Tokenizer(target_tokenizer).backend
        if not isinstance(vocabulary, dict) or not all(
            isinstance(piece, str) and isinstance(token_id, int) for piece, token_id in vocabulary.items()
        ):
            raise ValueError("The vocabulary must be a {piece: id} dict of strings to ints.")
        if sorted(vocabulary.values()) != list(range(len(vocabulary))):
            raise ValueError(f"The vocabulary's ids must be 0..{len(vocabulary) - 1}, each once.")
        missing = [token for token in SPECIAL_TOKENS if token not in vocabulary]
        if missing:
            raise ValueError(f"The vocabulary needs the tokens {missing}, which it lacks.")
        self.vocabulary = dict(vocabulary)
        self._tokens_by_id = sorted(vocabulary, key=vocabulary.get)
        self.end_token_id = vocabulary[END_TOKEN]
        self.unknown_token_id = vocabulary[UNKNOWN_TOKEN]
        self.pad_token_id = vocabulary[PAD_TOKEN]

    @classmethod
    def from_marian(cls, source_spm, target_spm, vocabulary):
        """From a Marian checkpoint's `source.spm`, `target.spm` and shared
        `vocab.json` (a path, or the `{piece: id}` dict).

        Raises:
            PresetFileError: if a file is missing or corrupt.
            ValueError: if a SentencePiece model is not a unigram one.
        """
        if isinstance(vocabulary, (str, Path)):
            vocabulary = _read_vocabulary(vocabulary)
        return cls(
            _sentencepiece_tokenizer(source_spm), _sentencepiece_tokenizer(target_spm), vocabulary,
            sentencepiece_models=(Path(source_spm).read_bytes(), Path(target_spm).read_bytes()),
        )

    @classmethod
    def from_characters(cls, characters):
        """A character-level tokenizer, for a model trained from scratch: one
        id per character, shared by the source and target sides.

        Args:
            characters: str or list of str. The characters to give ids: a
                string, or a list of strings (say the training sources and
                targets) whose characters all count.

        The ids are `</s>` 0, `<unk>` 1, `<pad>` 2, then the characters in
        code-point order, so the same characters give the same ids in any
        order. A character outside them is `<unk>`. As for every
        `TransformerTokenizer`, `</s>`, `<unk>` and `<pad>` written in a text
        are those tokens, a text that starts with a language code such as
        `>>fr<<` reads it as one token (`<unk>` here), and `decode` writes
        `▁` as a space and strips spaces at either end.

        Returns:
            A `TransformerTokenizer`.

        Raises:
            TypeError: `characters` is not a string or a list of strings.
            ValueError: `characters` holds no character.

        Example:

        >>> tokenizer = TransformerTokenizer.from_characters(["5 March 2021", "2021-03-05"])
        >>> tokenizer.vocabulary_size            # 3 special tokens, 12 characters
        15
        >>> tokenizer.encode(["5 May"])          # 'y' is not among the characters
        [[9, 3, 10, 11, 1]]
        >>> tokenizer.decode(tokenizer.encode_target(["2021-03-05"])[0] + [tokenizer.end_token_id])
        '2021-03-05'
        """
        texts = [characters] if isinstance(characters, str) else list(characters)
        if not all(isinstance(text, str) for text in texts):
            raise TypeError("characters must be a string or a list of strings.")
        alphabet = sorted(set("".join(texts)))
        if not alphabet:
            raise ValueError("characters holds no character to give an id.")
        vocabulary = {token: token_id for token_id, token in enumerate([*SPECIAL_TOKENS, *alphabet])}
        return cls(_character_tokenizer(vocabulary), _character_tokenizer(vocabulary), vocabulary)

    @classmethod
    def from_file(cls, path):
        """Not available: a `TransformerTokenizer` is three files, not one.

        Raises:
            TypeError: always, naming the ways to read one.
        """
        raise TypeError(
            f"A TransformerTokenizer cannot be read from the one file '{path}': it has three "
            f"({TOKENIZER_FILE}, {TARGET_TOKENIZER_FILE} and {VOCABULARY_FILE}). Read a directory written "
            "by `save` or `save_to_preset` with `TransformerTokenizer.from_source(PresetSource(directory))` "
            "(or the whole preprocessor with `TransformerSeq2SeqLMPreprocessor.from_preset(directory)`), "
            "or Marian's files with `TransformerTokenizer.from_marian(source_spm, target_spm, vocabulary)`."
        )

    @classmethod
    def from_source(cls, source):
        """Reads `tokenizer.json`, `target_tokenizer.json` and `vocab.json`
        of a preset (a `PresetSource`), and `source.spm` / `target.spm` if
        it has them."""
        models = [source.file(name) for name in SENTENCEPIECE_FILES]
        return cls(
            read_tokenizer_json(required_file(source, TOKENIZER_FILE)),
            read_tokenizer_json(required_file(source, TARGET_TOKENIZER_FILE)),
            _read_vocabulary(required_file(source, VOCABULARY_FILE)),
            sentencepiece_models=tuple(path.read_bytes() for path in models) if all(models) else None,
        )

    def save(self, directory):
        """Writes `tokenizer.json`, `target_tokenizer.json`, `vocab.json`
        and the SentencePiece models it has into `directory` (each
        atomically)."""
        directory = Path(directory)
        write_atomically(directory / TOKENIZER_FILE, self.backend.save)
        write_atomically(directory / TARGET_TOKENIZER_FILE, self.target_backend.save)
        self.save_marian_files(directory)

    def save_marian_files(self, directory):
        """Writes Marian's own files into `directory` (each atomically): the
        shared `vocab.json` and, where this tokenizer has them, `source.spm`
        and `target.spm` (what `transformers.MarianTokenizer` reads)."""
        directory = Path(directory)
        for name, model in zip(SENTENCEPIECE_FILES, self.sentencepiece_models or ()):
            write_atomically(directory / name, lambda path, model=model: Path(path).write_bytes(model))
        write_atomically(
            directory / VOCABULARY_FILE,
            lambda path: Path(path).write_text(
                json.dumps(self.vocabulary, ensure_ascii=False, indent=2) + "\n", encoding="utf-8"
            ),
        )

    @property
    def vocabulary_size(self):
        """Number of shared ids."""
        return len(self._tokens_by_id)

    @property
    def special_token_ids(self):
        """Ids of `</s>`, `<unk>` and `<pad>`."""
        return (self.end_token_id, self.unknown_token_id, self.pad_token_id)

    def token_to_id(self, token):
        """The id of `token`; raises if the vocabulary lacks it."""
        if token not in self.vocabulary:
            raise ValueError(f"The vocabulary has no token '{token}'.")
        return self.vocabulary[token]

    def id_to_token(self, token_id):
        """The token of `token_id`; raises if it is out of range."""
        token_id = int(token_id)
        if not 0 <= token_id < len(self._tokens_by_id):
            raise ValueError(f"Token id {token_id} is outside the vocabulary (0..{len(self._tokens_by_id) - 1}).")
        return self._tokens_by_id[token_id]

    def _encode(self, texts, backend):
        """Ids of each text: the special tokens are split off first; each
        stretch between them may start with a language code, and the rest is
        cut into pieces by `backend` (all stretches in one batch)."""
        # Splitting on a group alternates text, special token, text, ...
        parts = [_SPECIAL_TOKEN_SPLIT.split(text) for text in texts]
        stretches = [split_language_code(part) for text_parts in parts for part in text_parts[::2]]
        encodings = iter(backend.encode_batch([rest for _, rest in stretches], add_special_tokens=False))
        codes = iter(code for code, _ in stretches)
        encoded = []
        for text_parts in parts:
            tokens = []
            for index, part in enumerate(text_parts):
                if index % 2:
                    tokens.append(part)
                else:
                    code = next(codes)
                    tokens += ([code] if code else []) + next(encodings).tokens
            encoded.append([self.vocabulary.get(token, self.unknown_token_id) for token in tokens])
        return encoded

    def encode(self, texts):
        """Ids of each source text, without `</s>`: a list of lists."""
        return self._encode(checked_texts(texts, "source text"), self.backend)

    def encode_target(self, texts):
        """Ids of each target text, without `</s>`: a list of lists."""
        return self._encode(checked_texts(texts, "target text"), self.target_backend)

    def decode(self, ids, skip_special_tokens=True):
        """Target text of a list of ids, as `MarianTokenizer.decode` writes it.

        Special tokens kept (`skip_special_tokens=False`) are written as
        themselves and a space. The piece after one loses its leading `▁`
        here even if the target SentencePiece model lacks that piece, where
        `MarianTokenizer` would write it as a second space.
        """
        special = set(self.special_token_ids)
        text, pieces = "", []
        for token_id in ids:
            token = self.id_to_token(token_id)
            if int(token_id) not in special:
                pieces.append(token)
            elif not skip_special_tokens:
                text += self.target_backend.decoder.decode(pieces) + token + " "
                pieces = []
        text += self.target_backend.decoder.decode(pieces)
        return text.replace(WHITESPACE, " ").strip()
