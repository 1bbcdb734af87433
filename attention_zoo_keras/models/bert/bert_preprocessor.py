"""BERT's input packing: `[CLS] A [SEP]` or `[CLS] A [SEP] B [SEP]`, truncated
to the sequence length and padded, with segment ids and a padding mask."""

import numpy as np

from attention_zoo_keras.models.bert.bert_tokenizer import BertTokenizer
from attention_zoo_keras.models.text_preprocessor import TextPreprocessor
from attention_zoo_keras.registration import register


def truncate_longest_first(length_a, length_b, budget):
    """Lengths of two segments after "longest first" truncation to `budget`.

    Tokens are removed one at a time from the longer segment (from the second
    on ties), as `transformers` does; this returns the result in closed form.
    """
    if length_a + length_b <= budget:
        return length_a, length_b
    shorter = min(length_a, length_b)
    if 2 * shorter <= budget:
        return (shorter, budget - shorter) if length_a == shorter else (budget - shorter, shorter)
    return (budget + 1) // 2, budget // 2


@register
class BertPreprocessor(TextPreprocessor):
    """Raw strings (or pairs of them) to BERT's `token_ids`, `segment_ids` and
    `padding_mask`.

    Args:
        tokenizer: `BertTokenizer`. The tokenizer.
        sequence_length: int. The most tokens an example holds (longer texts
            are truncated, longest segment first).
        padding: str or None. `"buckets"` (`None`, the default): pad each
            batch to the smallest bucket length holding its longest example,
            at most `sequence_length`; `"max_length"`: always to
            `sequence_length` (see `TextPreprocessor`).
        bucket_lengths: list of int or None. With `"buckets"`, the lengths to
            pad to; `None` takes the powers of two from 16.

    Call args:
        x: str, list of str, or tuple of two lists of str. A string, a list
            of strings, or a tuple `(first, second)` of lists for sentence
            pairs.
        y: any or None. Passed through.
        sample_weight: any or None. Passed through.

    Example:

    >>> vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "great", "film"]
    >>> preprocessor = BertPreprocessor(BertTokenizer.from_vocabulary(vocab), sequence_length=6)
    >>> preprocessor(["a great film"])["token_ids"].tolist()
    [[2, 5, 6, 7, 3, 0]]
    >>> preprocessor = BertPreprocessor(BertTokenizer.from_vocabulary(vocab), bucket_lengths=[8, 16])
    >>> preprocessor(["a great film", "a film"])["padding_mask"].tolist()
    [[1, 1, 1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 0, 0, 0, 0]]
    """

    tokenizer_cls = BertTokenizer
    family = "bert"

    def __init__(self, tokenizer, sequence_length=512, padding=None, bucket_lengths=None):
        super().__init__(tokenizer, padding=padding, bucket_lengths=bucket_lengths)
        self.sequence_length = sequence_length

    def get_config(self):
        return {**super().get_config(), "sequence_length": self.sequence_length}

    def pack(self, x):
        """The feature dict of raw text `x` (numpy int32 arrays)."""
        segments = self.segments(x)
        if len(segments) > 2:
            raise ValueError(f"BERT takes one or two segments; got {len(segments)}.")
        encoded = [self.tokenizer.encode(segment) for segment in segments]
        tokenizer = self.tokenizer
        budget = self.sequence_length - 1 - len(segments)
        if budget < 0:
            raise ValueError(f"sequence_length {self.sequence_length} cannot hold the special tokens.")
        rows = []
        for pieces in zip(*encoded):
            if len(pieces) == 1:
                lengths = (min(len(pieces[0]), budget),)
            else:
                lengths = truncate_longest_first(len(pieces[0]), len(pieces[1]), budget)
            ids = [tokenizer.cls_token_id]
            segment = [0]
            for index, (piece, length) in enumerate(zip(pieces, lengths)):
                ids += piece[:length] + [tokenizer.sep_token_id]
                segment += [index] * (length + 1)
            rows.append((ids, segment))
        width = self.batch_width(max((len(ids) for ids, _ in rows), default=0), self.sequence_length)
        token_ids = np.full((len(rows), width), tokenizer.pad_token_id, dtype="int32")
        segment_ids = np.zeros((len(rows), width), dtype="int32")
        padding_mask = np.zeros((len(rows), width), dtype="int32")
        for row, (ids, segment) in enumerate(rows):
            token_ids[row, : len(ids)] = ids
            segment_ids[row, : len(ids)] = segment
            padding_mask[row, : len(ids)] = 1
        return {"token_ids": token_ids, "segment_ids": segment_ids, "padding_mask": padding_mask}

    def __call__(self, x, y=None, sample_weight=None):
        return self.with_labels(self.pack(x), y, sample_weight)
