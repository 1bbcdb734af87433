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
