"""GPT-2's byte-level BPE tokenizer (Radford et al., 2019, §2.2)."""

from pathlib import Path

import tokenizers
from tokenizers import decoders
from tokenizers import models
from tokenizers import pre_tokenizers

from attention_zoo_keras.tokenizers.tokenizer import Tokenizer

END_TOKEN = "<|endoftext|>"


class GPTTokenizer(Tokenizer):
    """Byte-level BPE tokenizer for GPT-2, whose one special token
    `<|endoftext|>` separates documents (and serves as padding here).

    Build it from a `tokenizer.json` (`GPTTokenizer.from_file`) or from
    `vocab.json` and `merges.txt` (`GPTTokenizer.from_vocabulary`).

    Example:

    >>> vocab = {"<|endoftext|>": 0, "a": 1, "b": 2, "Ġ": 3, "ab": 4, "Ġab": 5}
    >>> tokenizer = GPTTokenizer.from_vocabulary(vocab, [("a", "b"), ("Ġ", "ab")])
    >>> tokenizer.encode(["ab ab"])
    [[4, 5]]
    >>> tokenizer.end_token_id
    0
    """

    def __init__(self, tokenizer):
        super().__init__(tokenizer)
        if self.backend.token_to_id(END_TOKEN) is None:
            raise ValueError(f"A GPT-2 vocabulary needs the token '{END_TOKEN}', which this one lacks.")
        self.end_token_id = self.token_to_id(END_TOKEN)

    @property
    def special_token_ids(self):
        """Id of `<|endoftext|>`."""
        return (self.end_token_id,)

    @classmethod
    def from_vocabulary(cls, vocabulary, merges):
        """From `vocab.json` and `merges.txt` paths, or a `{token: id}` dict
        and a list of `(left, right)` merges."""
        if isinstance(vocabulary, (str, Path)) and isinstance(merges, (str, Path)):
            model = models.BPE.from_file(str(vocabulary), str(merges))
        else:
            if isinstance(vocabulary, (str, Path)) or isinstance(merges, (str, Path)):
                raise TypeError("Pass vocabulary and merges both as paths or both as in-memory data.")
            model = models.BPE(dict(vocabulary), [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in merges])
        tokenizer = tokenizers.Tokenizer(model)
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        if tokenizer.token_to_id(END_TOKEN) is not None:
            tokenizer.add_special_tokens([END_TOKEN])
        return cls(tokenizer)
