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
        tokenizer: a `tokenizers.Tokenizer`.

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
        """Ids of each text, without special tokens: a list of lists."""
        return [encoding.ids for encoding in self.backend.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids, skip_special_tokens=True):
        """Text of a list of ids."""
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def save(self, directory):
        """Writes `tokenizer.json` into `directory` (atomically)."""
        write_atomically(Path(directory) / TOKENIZER_FILE, self.backend.save)
