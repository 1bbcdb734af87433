"""Causal-LM data for GPT-2: raw text to inputs, next-token labels and weights.

    x = ids[:-1],  y = ids[1:],  weight = mask[1:]

Padding uses `<|endoftext|>` (GPT-2 has no pad token) with weight 0, so it
never counts in the loss or the metrics.
"""

import keras
import numpy as np

from attention_zoo_keras.models.gpt.gpt_tokenizer import GPTTokenizer
from attention_zoo_keras.models.text_preprocessor import TextPreprocessor
from attention_zoo_keras.registration import register


@register
class GPTCausalLMPreprocessor(TextPreprocessor):
    """Raw strings to GPT-2 `token_ids` and `padding_mask`, with the next
    tokens as labels.

    Args:
        tokenizer: a `GPTTokenizer`.
        sequence_length: length of the model inputs (texts are right-padded
            with `<|endoftext|>`, or truncated).
        add_start_token: prepend `<|endoftext|>` as a start token (as
            KerasHub does). Off by default: `transformers`' GPT-2 tokenizer
            adds none, and the pretrained model was not trained with one at
            the start of every example.
        add_end_token: append `<|endoftext|>`, so the model learns where a
            text ends (GPT-2's document separator). On by default.

    Call returns `(features, labels, sample_weight)`: `features` with
    `token_ids` and `padding_mask` `(batch, sequence_length)`; `labels` the
    ids one position on; `sample_weight` 1 where the label is a real token,
    0 on padding (times a given per-example `sample_weight`).

    Example:

    >>> vocab = {"<|endoftext|>": 0, "a": 1, "b": 2, "Ġ": 3, "ab": 4, "Ġab": 5}
    >>> tokenizer = GPTTokenizer.from_vocabulary(vocab, [("a", "b"), ("Ġ", "ab")])
    >>> preprocessor = GPTCausalLMPreprocessor(tokenizer, sequence_length=4)
    >>> x, y, w = preprocessor(["ab ab"])
    >>> x["token_ids"].tolist(), x["padding_mask"].tolist(), y.tolist(), w.tolist()
    ([[4, 5, 0, 0]], [[1, 1, 1, 0]], [[5, 0, 0, 0]], [[1.0, 1.0, 0.0, 0.0]])
    """

    tokenizer_cls = GPTTokenizer
    family = "gpt"

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

    def pack(self, x, sequence_length=None):
        """`{"token_ids", "padding_mask"}` of raw text `x` (numpy int32,
        `(batch, sequence_length)`), right-padded with `<|endoftext|>`."""
        segments = self.segments(x)
        if len(segments) != 1:
            raise ValueError(f"GPT-2 takes one text per example; got {len(segments)} segments.")
        length = sequence_length or self.sequence_length
        end = self.tokenizer.end_token_id
        start = [end] if self.add_start_token else []
        finish = [end] if self.add_end_token else []
        budget = length - len(start) - len(finish)
        if budget < 0:
            raise ValueError(f"sequence_length {length} cannot hold the special tokens.")
        encoded = self.tokenizer.encode(segments[0])
        token_ids = np.full((len(encoded), length), end, dtype="int32")
        padding_mask = np.zeros((len(encoded), length), dtype="int32")
        for row, ids in enumerate(encoded):
            ids = start + ids[:budget] + finish
            token_ids[row, : len(ids)] = ids
            padding_mask[row, : len(ids)] = 1
        return {"token_ids": token_ids, "padding_mask": padding_mask}

    def __call__(self, x, y=None, sample_weight=None):
        if y is not None:
            raise ValueError(
                "GPTCausalLMPreprocessor takes no labels: they are the text's next tokens. "
                "Pass only the texts."
            )
        packed = self.pack(x, self.sequence_length + 1)
        features = {key: value[:, :-1] for key, value in packed.items()}
        labels = packed["token_ids"][:, 1:]
        weights = packed["padding_mask"][:, 1:].astype("float32")
        if sample_weight is not None:
            weights = weights * np.asarray(sample_weight, dtype="float32").reshape(-1, 1)
        return keras.utils.pack_x_y_sample_weight(features, labels, weights)
