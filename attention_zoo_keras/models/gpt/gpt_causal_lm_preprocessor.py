"""Causal-LM data for GPT-2: raw text to inputs, next-token labels and weights.

    x = ids[:-1],  y = ids[1:],  weight = mask[1:]

Padding uses `<|endoftext|>` (GPT-2 has no pad token) with weight 0, so it
never counts in the loss or the metrics.
"""

from attention_zoo_keras.models.causal_lm_preprocessor import CausalLMPreprocessor
from attention_zoo_keras.models.gpt.gpt_tokenizer import GPTTokenizer
from attention_zoo_keras.registration import register


@register
class GPTCausalLMPreprocessor(CausalLMPreprocessor):
    """Raw strings to GPT-2 `token_ids` and `padding_mask`, with the next
    tokens as labels.

    Args:
        tokenizer: `GPTTokenizer`. The tokenizer.
        sequence_length: int. The most tokens a model input holds (texts are
            truncated to it, and right-padded with `<|endoftext|>`).
        add_start_token: bool. Prepend `<|endoftext|>` as a start token (as
            KerasHub does). Off by default: `transformers`' GPT-2 tokenizer
            adds none, and the pretrained model was not trained with one at
            the start of every example.
        add_end_token: bool. Append `<|endoftext|>`, so the model learns
            where a text ends (GPT-2's document separator). On by default.
        padding: str or None. How wide a batch is padded: by default to the
            smallest power of two from 16 that holds its longest text, at
            most `sequence_length` (see `TextPreprocessor`).
        bucket_lengths: list of int or None. The widths a batch may be padded
            to (see `TextPreprocessor`).

    Call returns `(features, labels, sample_weight)`: `features` with
    `token_ids` and `padding_mask` `(batch, width)`, `width` the batch's
    padded width; `labels` the ids one position on, as wide;
    `sample_weight` 1 where the label is a real token,
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
