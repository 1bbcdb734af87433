"""Shared handling of raw text inputs (one string, a list of strings, or a
tuple of lists for segment pairs) and of the width a batch of them is
padded to.

Padding every batch to `sequence_length` wastes most of the compute on
short texts (all-MiniLM pads to 256; trimming to the longest row was 4x
faster on torch), while padding to exactly the longest row makes compiled
backends (JAX, TensorFlow with XLA) compile one program per new length. So
by default a batch is padded to the smallest *bucket length* that holds its
longest row, capped at `sequence_length`:

    width = min(smallest bucket ≥ longest row, sequence_length)

with the buckets the powers of two from 16 (16, 32, 64, ...), or the
lengths a preprocessor is given; a compiled step then sees at most one
shape per bucket. `padding="max_length"` pads every batch to
`sequence_length`, for models whose graph needs one fixed length.
"""

import contextlib

import numpy as np

from attention_zoo_keras.models.preprocessor import Preprocessor
from attention_zoo_keras.naming import did_you_mean
from attention_zoo_keras.tokenizers.tokenizer import checked_texts

PADDING_MODES = ("buckets", "max_length")
SMALLEST_BUCKET = 16


def _is_text(item):
    return isinstance(item, (str, bytes))


def _is_text_list(x):
    """Whether `x` is meant as text: a string, or a list / array holding at
    least one string (the other items are checked, and refused, later)."""
    if isinstance(x, str):
        return True
    if isinstance(x, np.ndarray):
        if x.dtype.kind in ("U", "S"):
            return True
        return x.dtype.kind == "O" and (x.size == 0 or any(_is_text(item) for item in x.flat))
    if isinstance(x, list):
        return len(x) == 0 or any(_is_text(item) for item in x)
    return False


def is_text(x):
    """Whether `x` is text a text preprocessor takes: a string, a list or
    array of them, or a tuple of such (segments: pairs of texts)."""
    if isinstance(x, tuple):
        return len(x) > 0 and all(_is_text_list(part) for part in x)
    return _is_text_list(x)


def as_text_list(x, what="text"):
    """A list of `str` from a string, list or array of strings: bytes are
    decoded, and items that are not text (`None`, numbers) or not valid
    Unicode are refused with an error naming their position
    (`tokenizers.tokenizer.checked_texts`)."""
    if isinstance(x, str):
        return [x]
    if not isinstance(x, (list, tuple, np.ndarray)):
        raise TypeError(f"Expected a string or a list of strings as {what}; got {type(x).__name__}.")
    if isinstance(x, np.ndarray) and x.ndim > 1 and x.size != len(x):
        raise ValueError(
            f"Got a {x.shape} array as {what}: give one text per example (a 1-D array, or one column); "
            "sentence pairs are a tuple (first texts, second texts)."
        )
    return checked_texts(np.ravel(x).tolist() if isinstance(x, np.ndarray) else x, what)


def as_text_batch(texts):
    """One string (or 0-d array of one) as a list of one; texts as they are."""
    if isinstance(texts, str) or (isinstance(texts, np.ndarray) and texts.ndim == 0):
        return [texts.item() if isinstance(texts, np.ndarray) else texts]
    return texts


def check_padding(padding, bucket_lengths):
    """`(padding, bucket_lengths)` checked: `padding` one of `PADDING_MODES`,
    `bucket_lengths` `None` or positive ints (returned sorted, as a list),
    given only with `padding="buckets"`."""
    if padding not in PADDING_MODES:
        raise ValueError(
            f"padding must be one of {', '.join(repr(mode) for mode in PADDING_MODES)}; got {padding!r}."
            + did_you_mean(padding, PADDING_MODES)
        )
    if bucket_lengths is None:
        return padding, None
    if padding != "buckets":
        raise ValueError(f"bucket_lengths applies to padding='buckets' only; padding is {padding!r}.")
    lengths = list(bucket_lengths) if isinstance(bucket_lengths, (list, tuple)) else None
    if not lengths or any(
        not isinstance(length, (int, np.integer)) or isinstance(length, bool) or length < 1 for length in lengths
    ):
        raise ValueError(f"bucket_lengths must be a non-empty list of positive ints; got {bucket_lengths!r}.")
    return padding, sorted(int(length) for length in lengths)


def padded_width(longest, sequence_length, padding="buckets", bucket_lengths=None):
    """The width a batch whose longest row holds `longest` tokens is padded
    to (see the module notes).

    Args:
        longest: int. Tokens in the batch's longest row (after truncation).
        sequence_length: int. The most a row may hold; no batch is wider.
        padding: str. `"buckets"` or `"max_length"` (always
            `sequence_length`).
        bucket_lengths: list of int or None. The bucket lengths; `None`:
            the powers of two from 16.

    >>> padded_width(5, 512), padded_width(17, 512), padded_width(300, 512), padded_width(40, 36)
    (16, 32, 512, 36)
    >>> padded_width(5, 512, "max_length"), padded_width(5, 512, bucket_lengths=[8, 100])
    (512, 8)
    """
    if padding == "max_length":
        return sequence_length
    if bucket_lengths is None:
        width = SMALLEST_BUCKET
        while width < longest:
            width *= 2
        return min(width, sequence_length)
    fitting = [length for length in bucket_lengths if length >= longest]
    return min(min(fitting), sequence_length) if fitting else sequence_length


class TextPreprocessor(Preprocessor):
    """A preprocessor whose raw input is text, alone or as segment pairs,
    and whose batches are padded as `padding` says (see the module notes).

    Args:
        tokenizer: Tokenizer. The family's tokenizer.
        padding: str or None. `"buckets"`: pad each batch to the smallest
            bucket length that holds its longest row (at most
            `sequence_length`); `"max_length"`: pad every batch to
            `sequence_length`. `None`: the class's `default_padding`
            (`"buckets"`; the Reformer's preprocessors, whose chunked
            attention is shaped by the length, `"max_length"`).
        bucket_lengths: list or tuple of int, or None. With `"buckets"`, the
            lengths a batch may be padded to; `None`: the powers of two from
            16 (16, 32, 64, ...).
    """

    default_padding = "buckets"

    def __init__(self, tokenizer, padding=None, bucket_lengths=None):
        super().__init__(tokenizer)
        if padding is None:
            padding = self.default_padding
        self.padding, self.bucket_lengths = check_padding(padding, bucket_lengths)

    def get_config(self):
        return {"padding": self.padding, "bucket_lengths": self.bucket_lengths}

    def batch_width(self, longest, sequence_length):
        """The width of a batch whose longest row holds `longest` tokens, at
        most `sequence_length` (`padded_width` with this preprocessor's
        `padding` and `bucket_lengths`)."""
        return padded_width(longest, sequence_length, self.padding, self.bucket_lengths)

    @contextlib.contextmanager
    def padded_to(self, width):
        """Within the block, every batch is padded to `width` (at most the
        sequence length), whatever its longest row: `predict` gives outputs
        of one width, which Keras can join, when its batches would have
        been padded to different buckets."""
        saved = self.padding, self.bucket_lengths
        self.padding, self.bucket_lengths = "buckets", [int(width)]
        try:
            yield self
        finally:
            self.padding, self.bucket_lengths = saved

    def is_raw(self, x):
        return is_text(x)

    def segments(self, x):
        """The input as a list of segments, each a list of strings.

        Raises `TypeError` for input that is not text (naming the first item
        that is not a string), `ValueError` for text that is not valid
        Unicode or for segments of different numbers of texts."""
        parts = x if isinstance(x, tuple) else (x,)
        if not parts or not all(isinstance(part, (str, list, np.ndarray)) for part in parts):
            raise TypeError(
                f"{type(self).__name__} takes a string, a list of strings, or a tuple of "
                f"lists for segment pairs; got {type(x).__name__}."
            )
        names = ["text"] if len(parts) == 1 else ["first text", "second text"]
        names += [f"text of segment {index}" for index in range(len(names), len(parts))]
        segments = [as_text_list(part, name) for part, name in zip(parts, names)]
        counts = [len(segment) for segment in segments]
        if len(set(counts)) > 1:
            raise ValueError(
                f"The segments hold different numbers of examples: {counts}; give every example one "
                "text in each segment."
            )
        return segments

    def count_examples(self, x):
        return len(self.segments(x)[0])

    def as_batch(self, x):
        """`x` with each single text (a string, a 0-d array) as a list of
        one, segment by segment.

        >>> from attention_zoo_keras.models import BertPreprocessor, BertTokenizer
        >>> tokenizer = BertTokenizer.from_vocabulary(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "film"])
        >>> BertPreprocessor(tokenizer).as_batch(("a film", "dull"))
        (['a film'], ['dull'])
        """
        if isinstance(x, tuple):
            return tuple(as_text_batch(part) for part in x)
        return as_text_batch(x)


class PackedTextPreprocessor(TextPreprocessor):
    """One text per example to right-padded `token_ids` and `padding_mask`
    (`pack`); subclasses say what `__call__` returns and set
    `tokenizer_cls` and `family`.

    Args:
        tokenizer: Tokenizer. The family's tokenizer (it has an
            `end_token_id`, and a `pad_token_id` if it has a padding token).
        sequence_length: int. The most tokens a model input holds (longer
            texts are truncated).
        add_start_token: bool. Prepend the end token as a start token.
        add_end_token: bool. Append the end token, so the model learns where
            a text ends.
        padding: str or None. How wide a batch is padded (see
            `TextPreprocessor`).
        bucket_lengths: list or tuple of int, or None. The lengths a batch
            may be padded to (see `TextPreprocessor`).

    Padding uses the tokenizer's `pad_token_id`, or its end token if it has
    none (GPT-2).
    """

    def __init__(
        self, tokenizer, sequence_length=1024, add_start_token=False, add_end_token=True, padding=None,
        bucket_lengths=None,
    ):
        super().__init__(tokenizer, padding=padding, bucket_lengths=bucket_lengths)
        self.sequence_length = sequence_length
        self.add_start_token = add_start_token
        self.add_end_token = add_end_token

    def get_config(self):
        return {
            **super().get_config(),
            "sequence_length": self.sequence_length,
            "add_start_token": self.add_start_token,
            "add_end_token": self.add_end_token,
        }

    @property
    def pad_token_id(self):
        """The id padding gets: the tokenizer's padding token, or its end token."""
        pad = getattr(self.tokenizer, "pad_token_id", None)
        return self.tokenizer.end_token_id if pad is None else pad

    def pack(self, x, sequence_length=None, shift=0):
        """`{"token_ids", "padding_mask"}` of raw text `x` (numpy int32,
        `(batch, width + shift)`), right-padded.

        Each row holds at most `sequence_length + shift` tokens
        (`sequence_length` defaults to this preprocessor's), and the batch is
        `batch_width(longest row - shift, sequence_length) + shift` wide: a
        causal LM packs one token more than its inputs (`shift=1`), to slice
        inputs and next-token labels of the same width from it.
        """
        segments = self.segments(x)
        if len(segments) != 1:
            raise ValueError(f"{type(self).__name__} takes one text per example; got {len(segments)} segments.")
        sequence_length = sequence_length or self.sequence_length
        length = sequence_length + shift
        end = self.tokenizer.end_token_id
        start = [end] if self.add_start_token else []
        finish = [end] if self.add_end_token else []
        budget = length - len(start) - len(finish)
        if budget < 0:
            raise ValueError(f"sequence_length {sequence_length} cannot hold the special tokens.")
        rows = [start + ids[:budget] + finish for ids in self.tokenizer.encode(segments[0])]
        longest = max((len(ids) for ids in rows), default=0)
        width = self.batch_width(max(longest - shift, 0), sequence_length) + shift
        token_ids = np.full((len(rows), width), self.pad_token_id, dtype="int32")
        padding_mask = np.zeros((len(rows), width), dtype="int32")
        for row, ids in enumerate(rows):
            token_ids[row, : len(ids)] = ids
            padding_mask[row, : len(ids)] = 1
        return {"token_ids": token_ids, "padding_mask": padding_mask}
