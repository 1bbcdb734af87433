"""A thin wrapper over a Hugging Face `tokenizers.Tokenizer`.

The wrapped tokenizer does normalization, pre-tokenization and the subword
model; special tokens, truncation and padding are the preprocessor's job,
so they are switched off here. Saved as `tokenizer.json`, the `tokenizers`
library's own format, which other tools read too. A tokenizer writes its
files into a preset directory (`save`) and reads itself back from a preset
(`from_source`), so one that needs more files than `tokenizer.json` keeps
them to itself.
"""

from pathlib import Path

import tokenizers

from attention_zoo_keras.hub.atomic import write_atomically
from attention_zoo_keras.hub.preset_format import TOKENIZER_FILE
from attention_zoo_keras.hub.source import PresetFileError


def read_tokenizer_json(path):
    """The `tokenizers.Tokenizer` saved in `path`; raises `PresetFileError`
    naming the file if it is not one."""
    try:
        return tokenizers.Tokenizer.from_file(str(path))
    except Exception as error:  # the Rust library raises a bare Exception
        raise PresetFileError(f"'{path}' is not a valid tokenizer.json: {error}") from error


def checked_texts(texts, what="text"):
    """`texts` as a list of `str`, each checked to be text the tokenizer can
    read: `bytes` are decoded as UTF-8; anything else that is not a `str`
    (`None`, numbers) is refused rather than turned into text, and so is a
    string that is not valid Unicode (a lone surrogate such as `"\\ud800"`,
    which the `tokenizers` library rejects with a bare `TypeError`).

    Args:
        texts: iterable of str or bytes. The texts (bytes in UTF-8); not a
            string itself.
        what: str. What one item is called in errors (`"text"`,
            `"source text"`).

    Returns:
        A new list of `str`.

    Raises:
        TypeError: for a single string given as `texts`, or an item that is
            not a string; the message names the item's position and type.
        ValueError: for an item that is not valid UTF-8 / Unicode, naming
            its position and the offending character.

    >>> checked_texts(["a", b"b"])
    ['a', 'b']
    >>> checked_texts(["a film", None])
    Traceback (most recent call last):
    ...
    TypeError: Text 1 is None, not a string; only strings (or UTF-8 bytes) are tokenized.
    """
    if isinstance(texts, (str, bytes)):
        raise TypeError(f"Expected a list of {what}s; got one {type(texts).__name__}. Wrap it in a list.")
    checked = []
    for index, item in enumerate(texts):
        if isinstance(item, bytes):
            try:
                item = item.decode("utf-8")
            except UnicodeDecodeError as error:
                raise ValueError(f"{what.capitalize()} {index} is bytes that are not valid UTF-8: {error}.") from None
        elif not isinstance(item, str):
            kind = "None" if item is None else f"a value of type {type(item).__name__} ({item!r})"
            raise TypeError(
                f"{what.capitalize()} {index} is {kind}, not a string; only strings (or UTF-8 bytes) are tokenized."
            )
        checked.append(item)
    try:
        "".join(checked).encode("utf-8")  # one pass over all texts; the culprit is looked up only on failure
    except UnicodeEncodeError:
        for index, text in enumerate(checked):
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as error:
                raise ValueError(
                    f"{what.capitalize()} {index} is not valid Unicode: it holds the lone surrogate "
                    f"{ascii(text[error.start])} at character {error.start}. Decode the source text "
                    "properly (or replace such characters) before tokenizing."
                ) from None
    return checked


def required_file(source, filename):
    """Local path of the tokenizer file `filename` of a `PresetSource`;
    raises `PresetFileError` if the preset lacks it."""
    path = source.file(filename)
    if path is None:
        raise PresetFileError(
            f"Preset '{source.description}' has no '{filename}', so no preprocessor "
            "can be built from it; pass `preprocessor=` yourself."
        )
    return path


class Tokenizer:
    """Text to ids and back.

    Args:
        tokenizer: tokenizers.Tokenizer. The wrapped tokenizer.

    Example:

    >>> from attention_zoo_keras.tokenizers.word_piece import word_piece_tokenizer
    >>> tok = Tokenizer(word_piece_tokenizer(["[UNK]", "the", "cat"]))
    >>> tok.encode(["The cat"])
    [[1, 2]]
    """

    def __init__(self, tokenizer):
        if not isinstance(tokenizer, tokenizers.Tokenizer):
            raise TypeError(f"Expected a tokenizers.Tokenizer, got {type(tokenizer).__name__}.")
        tokenizer.no_truncation()
        tokenizer.no_padding()
        self.backend = tokenizer

    @classmethod
    def from_file(cls, path):
        """Reads a `tokenizer.json`."""
        return cls(read_tokenizer_json(path))

    @classmethod
    def from_source(cls, source):
        """Reads the tokenizer a preset holds (a `PresetSource`): its
        `tokenizer.json`."""
        return cls.from_file(required_file(source, TOKENIZER_FILE))

    @property
    def vocabulary_size(self):
        """Number of ids, added tokens included."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token):
        """The id of `token`; raises if the vocabulary lacks it."""
        token_id = self.backend.token_to_id(token)
        if token_id is None:
            raise ValueError(f"The vocabulary has no token '{token}'.")
        return token_id

    def id_to_token(self, token_id):
        """The token of `token_id`."""
        return self.backend.id_to_token(int(token_id))

    def encode(self, texts):
        """Ids of each text (a list of strings, see `checked_texts`), without
        special tokens: a list of lists."""
        return [encoding.ids for encoding in self.backend.encode_batch(checked_texts(texts), add_special_tokens=False)]

    def decode(self, ids, skip_special_tokens=True):
        """Text of a list of ids."""
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def save(self, directory):
        """Writes `tokenizer.json` into `directory` (atomically)."""
        write_atomically(Path(directory) / TOKENIZER_FILE, self.backend.save)
