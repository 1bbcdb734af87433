"""BERT's WordPiece tokenizer with its special tokens."""

import json

from attention_zoo_keras.tokenizers.tokenizer import Tokenizer
from attention_zoo_keras.tokenizers.word_piece import word_piece_tokenizer

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


class BertTokenizer(Tokenizer):
    """WordPiece tokenizer for BERT (Devlin et al., 2019).

    Build it from a `tokenizer.json` (`BertTokenizer.from_file`) or a
    `vocab.txt` (`BertTokenizer.from_vocabulary`).

    Example:

    >>> vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "great", "film"]
    >>> tokenizer = BertTokenizer.from_vocabulary(vocab)
    >>> tokenizer.encode(["A great film"])
    [[5, 6, 7]]
    >>> tokenizer.cls_token_id, tokenizer.sep_token_id
    (2, 3)
    """

    def __init__(self, tokenizer):
        super().__init__(tokenizer)
        missing = [token for token in SPECIAL_TOKENS if self.backend.token_to_id(token) is None]
        if missing:
            raise ValueError(f"A BERT vocabulary needs the tokens {missing}, which this one lacks.")
        self.pad_token_id = self.token_to_id("[PAD]")
        self.unk_token_id = self.token_to_id("[UNK]")
        self.cls_token_id = self.token_to_id("[CLS]")
        self.sep_token_id = self.token_to_id("[SEP]")
        self.mask_token_id = self.token_to_id("[MASK]")

    @property
    def special_token_ids(self):
        """Ids of `[PAD]`, `[UNK]`, `[CLS]`, `[SEP]` and `[MASK]`."""
        return (self.pad_token_id, self.unk_token_id, self.cls_token_id, self.sep_token_id, self.mask_token_id)

    @property
    def normalizer_settings(self):
        """`{"lowercase": bool, "strip_accents": bool or None}`: how text is
        normalized (the `BertNormalizer` of `tokenizer.json`; `False` /
        `None` where there is none)."""
        settings = {"lowercase": False, "strip_accents": None}
        normalizer = json.loads(self.backend.to_str()).get("normalizer") or {}
        steps = normalizer.get("normalizers", [normalizer]) if normalizer.get("type") == "Sequence" else [normalizer]
        for step in steps:
            if step.get("type") == "BertNormalizer":
                settings = {"lowercase": step["lowercase"], "strip_accents": step["strip_accents"]}
            elif step.get("type") == "Lowercase":
                settings["lowercase"] = True
        return settings

    @classmethod
    def from_vocabulary(cls, vocabulary, lowercase=True, strip_accents=None):
        """From a `vocab.txt` path, a list of tokens, or `{token: id}`."""
        return cls(
            word_piece_tokenizer(
                vocabulary,
                lowercase=lowercase,
                strip_accents=strip_accents,
                special_tokens=SPECIAL_TOKENS,
            )
        )
