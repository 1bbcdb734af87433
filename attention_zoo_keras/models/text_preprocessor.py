"""Shared handling of raw text inputs: one string, a list of strings, or a
tuple of lists for segment pairs."""

import numpy as np

from attention_zoo_keras.models.preprocessor import Preprocessor


def _is_text_list(x):
    if isinstance(x, str):
        return True
    if isinstance(x, np.ndarray):
        return x.dtype.kind in ("U", "S", "O") and (x.size == 0 or isinstance(x.flat[0], (str, bytes)))
    if isinstance(x, list):
        return len(x) == 0 or isinstance(x[0], (str, bytes))
    return False


def as_text_list(x):
    """A list of `str` from a string, list or array of strings (bytes decoded)."""
    if isinstance(x, str):
        return [x]
    return [item.decode("utf-8") if isinstance(item, bytes) else str(item) for item in list(np.ravel(x) if isinstance(x, np.ndarray) else x)]


class TextPreprocessor(Preprocessor):
    """A preprocessor whose raw input is text, alone or as segment pairs."""

    def is_raw(self, x):
        if isinstance(x, tuple):
            return len(x) > 0 and all(_is_text_list(part) for part in x)
        return _is_text_list(x)

    def segments(self, x):
        """The input as a list of segments, each a list of strings."""
        if not self.is_raw(x):
            raise TypeError(
                f"{type(self).__name__} takes a string, a list of strings, or a tuple of "
                f"lists for segment pairs; got {type(x).__name__}."
            )
        parts = [as_text_list(part) for part in (x if isinstance(x, tuple) else (x,))]
        if len({len(part) for part in parts}) > 1:
            raise ValueError(f"Segments have different numbers of examples: {[len(p) for p in parts]}.")
        return parts

    def num_examples(self, x):
        return len(self.segments(x)[0])


class PackedTextPreprocessor(TextPreprocessor):
    """One text per example to right-padded `token_ids` and `padding_mask`
    (`pack`); subclasses say what `__call__` returns and set
    `tokenizer_cls` and `family`.

    Args:
        tokenizer: the family's tokenizer (it has an `end_token_id`, and a
            `pad_token_id` if it has a padding token).
        sequence_length: length of the model inputs (texts are right-padded,
            or truncated).
        add_start_token: prepend the end token as a start token.
        add_end_token: append the end token, so the model learns where a
            text ends.

    Padding uses the tokenizer's `pad_token_id`, or its end token if it has
    none (GPT-2).
    """

    def __init__(self, tokenizer, sequence_length=1024, add_start_token=False, add_end_token=True):
        super().__init__(tokenizer)
        self.sequence_length = sequence_length
        self.add_start_token = add_start_token
        self.add_end_token = add_end_token

    def get_config(self):
        return {
            "sequence_length": self.sequence_length,
            "add_start_token": self.add_start_token,
            "add_end_token": self.add_end_token,
        }

    @property
    def pad_token_id(self):
        """The id padding gets: the tokenizer's padding token, or its end token."""
        pad = getattr(self.tokenizer, "pad_token_id", None)
        return self.tokenizer.end_token_id if pad is None else pad

    def pack(self, x, sequence_length=None):
        """`{"token_ids", "padding_mask"}` of raw text `x` (numpy int32,
        `(batch, sequence_length)`), right-padded."""
        segments = self.segments(x)
        if len(segments) != 1:
            raise ValueError(f"{type(self).__name__} takes one text per example; got {len(segments)} segments.")
        length = sequence_length or self.sequence_length
        end = self.tokenizer.end_token_id
        start = [end] if self.add_start_token else []
        finish = [end] if self.add_end_token else []
        budget = length - len(start) - len(finish)
        if budget < 0:
            raise ValueError(f"sequence_length {length} cannot hold the special tokens.")
        encoded = self.tokenizer.encode(segments[0])
        token_ids = np.full((len(encoded), length), self.pad_token_id, dtype="int32")
        padding_mask = np.zeros((len(encoded), length), dtype="int32")
        for row, ids in enumerate(encoded):
            ids = start + ids[:budget] + finish
            token_ids[row, : len(ids)] = ids
            padding_mask[row, : len(ids)] = 1
        return {"token_ids": token_ids, "padding_mask": padding_mask}
