"""WordPiece (Schuster & Nakajima, 2012; Wu et al., 2016), as BERT uses it:
lower-case and strip accents (uncased models), split on whitespace and
punctuation, then greedily match the longest vocabulary piece, marking
word-internal pieces with `##`.
"""

from pathlib import Path

import tokenizers
from tokenizers import decoders
from tokenizers import models
from tokenizers import normalizers
from tokenizers import pre_tokenizers


def read_vocabulary(vocabulary):
    """`{token: id}` from a `vocab.txt` path, a list of tokens or a dict."""
    if isinstance(vocabulary, dict):
        return dict(vocabulary)
    if isinstance(vocabulary, (str, Path)):
        tokens = Path(vocabulary).read_text(encoding="utf-8").splitlines()
    else:
        tokens = list(vocabulary)
    return {token: index for index, token in enumerate(tokens)}


def word_piece_tokenizer(vocabulary, lowercase=True, strip_accents=None, unk_token="[UNK]", special_tokens=()):
    """A `tokenizers.Tokenizer` doing BERT's WordPiece.

    Args:
        vocabulary: str or Path, list of str, or dict. A `vocab.txt` path,
            a list of tokens, or `{token: id}`.
        lowercase: bool. Lower-case the text (uncased models).
        strip_accents: bool or None. Strip accents; `None` follows
            `lowercase`, as BERT does.
        unk_token: str. The token for unknown words.
        special_tokens: sequence of str. Tokens never split (e.g.
            `"[MASK]"`).
    """
    vocab = read_vocabulary(vocabulary)
    if unk_token not in vocab:
        raise ValueError(f"The vocabulary lacks the unknown token '{unk_token}'.")
    tokenizer = tokenizers.Tokenizer(models.WordPiece(vocab, unk_token=unk_token))
    tokenizer.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=strip_accents, lowercase=lowercase
    )
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    present = [token for token in special_tokens if token in vocab]
    if present:
        tokenizer.add_special_tokens(present)
    return tokenizer
