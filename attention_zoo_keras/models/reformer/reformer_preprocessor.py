"""Encoder data for the Reformer (Kitaev et al., 2020): raw text to
`token_ids` and `padding_mask`, labels passed through — for
`ReformerTextClassifier`, and the base of `ReformerMaskedLMPreprocessor`.

    ids = [</s>]? pieces(text)[:budget] [</s>]?,  right-padded to sequence_length

With either Reformer tokenizer: the SentencePiece pieces of
crime-and-punishment (padded with `</s>`, as it has no padding token) or
the enwik8 bytes (padded with `<pad>`, ended with `<EOS>`). The padding
id does not matter to the model: `padding_mask` masks those positions.
"""

from attention_zoo_keras.models.reformer.reformer_tokenizer import ReformerTokenizer
from attention_zoo_keras.models.text_preprocessor import PackedTextPreprocessor
from attention_zoo_keras.registration import register


@register
class ReformerPreprocessor(PackedTextPreprocessor):
    """Raw strings to Reformer `token_ids` and `padding_mask` `(batch,
    sequence_length)`, with labels and sample weights passed through.

    Args:
        tokenizer: `ReformerTokenizer` or `ReformerByteTokenizer`. The
            tokenizer.
        sequence_length: int. Every output is right-padded or truncated to
            this length. To train, it must be a multiple of the model's chunk
            lengths (their least common multiple), and with axial positions
            exactly their number `n₁·n₂`.
        add_start_token: bool. Prepend the end token as a start token (off;
            the Reformer tokenizers have no start token).
        add_end_token: bool. Append the end token (on), as
            `ReformerCausalLMPreprocessor` does, so a preset's settings carry
            over between the Reformer tasks.
        padding: str or None. `"max_length"` by default (`None`), unlike the
            other families' preprocessors: the chunked attention is shaped by
            the length (the backbone's `static_sequence_length`), so every
            batch is `sequence_length` wide. `"buckets"`: see
            `TextPreprocessor`.
        bucket_lengths: list of int or None. With `padding="buckets"`, the
            lengths to pad to.

    Call args:
        x: str or list of str. The text(s).
        y: any or None. Passed through (one entry per text).
        sample_weight: any or None. Passed through (one entry per text).

    Example:

    >>> from attention_zoo_keras.models.reformer.reformer_tokenizer import ReformerByteTokenizer
    >>> preprocessor = ReformerPreprocessor(ReformerByteTokenizer(), sequence_length=6)
    >>> x, y = preprocessor(["Hi", "Hello!"], [0, 1])
    >>> x["token_ids"].tolist(), x["padding_mask"].tolist(), y
    ([[74, 107, 1, 0, 0, 0], [74, 103, 110, 110, 113, 1]], [[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1]], [0, 1])
    """

    tokenizer_cls = ReformerTokenizer
    family = "reformer"
    default_padding = "max_length"

    def __call__(self, x, y=None, sample_weight=None):
        return self.with_labels(self.pack(x), y, sample_weight)
