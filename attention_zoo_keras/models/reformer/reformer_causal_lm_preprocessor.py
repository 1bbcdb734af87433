"""Causal-LM data for the Reformer: raw text to inputs, next-token labels
and weights (see `models.causal_lm_preprocessor`), with either Reformer
tokenizer: the SentencePiece pieces of crime-and-punishment (padded with
`</s>`, which it also ends texts with) or the enwik8 bytes (padded with
`<pad>`, ended with `<EOS>`)."""

from attention_zoo_keras.models.causal_lm_preprocessor import CausalLMPreprocessor
from attention_zoo_keras.models.reformer.reformer_tokenizer import ReformerTokenizer
from attention_zoo_keras.registration import register


@register
class ReformerCausalLMPreprocessor(CausalLMPreprocessor):
    """Raw strings to Reformer `token_ids` and `padding_mask`, with the next
    tokens as labels.

    Args:
        tokenizer: `ReformerTokenizer` or `ReformerByteTokenizer`. The
            tokenizer.
        sequence_length: int. The length of the model inputs. To train, it
            must be a multiple of the model's chunk lengths, and with axial
            positions exactly their number `n₁·n₂`.
        add_start_token: bool. Prepend the end token as a start token (off).
        add_end_token: bool. Append the end token (on).
        padding: str or None. As in `ReformerPreprocessor` (every batch
            `sequence_length` wide by default: the chunked attention is
            shaped by the length).
        bucket_lengths: list of int or None. As in `ReformerPreprocessor`.

    Example:

    >>> from attention_zoo_keras.models.reformer.reformer_tokenizer import ReformerByteTokenizer
    >>> preprocessor = ReformerCausalLMPreprocessor(ReformerByteTokenizer(), sequence_length=4)
    >>> x, y, w = preprocessor(["Hi"])
    >>> x["token_ids"].tolist(), y.tolist(), w.tolist()
    ([[74, 107, 1, 0]], [[107, 1, 0, 0]], [[1.0, 1.0, 0.0, 0.0]])
    """

    tokenizer_cls = ReformerTokenizer
    family = "reformer"
    default_padding = "max_length"
