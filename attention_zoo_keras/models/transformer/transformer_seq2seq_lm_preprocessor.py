"""Sequence-to-sequence data for the encoder-decoder Transformer (Vaswani et
al., 2017): source and target texts to encoder inputs, decoder inputs and
labels, by teacher forcing.

    encoder = source + </s>
    labels  = target + </s>
    decoder = [start] + target          (the labels shifted right by one)

as `transformers`' `shift_tokens_right` builds the decoder inputs of Marian
MT, whose start token is `<pad>`. Padding uses `<pad>` with label weight 0,
so it never counts in the loss or the metrics.
"""

import keras
import numpy as np

from attention_zoo_keras.models.preprocessor import weighted
from attention_zoo_keras.models.text_preprocessor import TextPreprocessor
from attention_zoo_keras.models.transformer.transformer_tokenizer import TransformerTokenizer
from attention_zoo_keras.registration import register


def _padded(rows, length, pad_id):
    """`(token_ids, padding_mask)` of lists of ids (none longer than
    `length`), right-padded to `length` (numpy int32)."""
    token_ids = np.full((len(rows), length), pad_id, dtype="int32")
    padding_mask = np.zeros((len(rows), length), dtype="int32")
    for row, ids in enumerate(rows):
        token_ids[row, : len(ids)] = ids
        padding_mask[row, : len(ids)] = 1
    return token_ids, padding_mask


@register
class TransformerSeq2SeqLMPreprocessor(TextPreprocessor):
    """Raw source and target strings to a translation model's encoder and
    decoder inputs, with the next target tokens as labels.

    Args:
        tokenizer: `TransformerTokenizer`. The tokenizer.
        encoder_sequence_length: int. The most tokens an encoder input
            holds. A longer source is truncated, keeping its final `</s>`.
        decoder_sequence_length: int. The most tokens a decoder input (and
            its labels) holds. A longer target is truncated to
            `decoder_sequence_length - 1` tokens; the labels still end in
            `</s>` (as `transformers` truncates), the decoder inputs in the
            last kept target token.
        decoder_start_token_id: int or None. The decoder's first input;
            `None`: `<pad>`, Marian's choice.
        padding: str or None. `"buckets"` (`None`, the default): the encoder
            inputs of a batch are padded to the smallest bucket length that
            holds its longest source (at most `encoder_sequence_length`), the
            decoder inputs and labels likewise for the targets;
            `"max_length"`: to `encoder_sequence_length` and
            `decoder_sequence_length`.
        bucket_lengths: list of int or None. With `"buckets"`, the lengths to
            pad to; `None` takes the powers of two from 16 (see
            `TextPreprocessor`).

    Call args:
        x: tuple of two lists of str, str, or list of str.
            `(sources, targets)`, two lists of strings of equal length, to
            train or evaluate; the sources alone (a string or a list) to
            predict or generate, which gives the encoder features only.
        y: None. Must be `None`: the labels come from the targets.
        sample_weight: array of shape `(batch,)` or None. Per-example
            weights, multiplied into the label weights.

    Call returns `(features, labels, sample_weight)` for `(sources,
    targets)`: `features` with `encoder_token_ids`, `encoder_padding_mask`
    `(batch, encoder width)` and `decoder_token_ids`, `decoder_padding_mask`
    `(batch, decoder width)` (each width at most its sequence length);
    `labels` the target ids one position on, as wide as the decoder inputs;
    `sample_weight` 1 on real labels, 0 on padding.

    Example:

    >>> from attention_zoo_keras.tokenizers.sentencepiece_model import (
    ...     SentencePiece, SentencePieceModel, UNKNOWN, unigram_tokenizer)
    >>> spm = unigram_tokenizer(SentencePieceModel(pieces=(
    ...     SentencePiece("<unk>", 0.0, UNKNOWN), SentencePiece("▁a", -1.0), SentencePiece("▁b", -1.0))))
    >>> tokenizer = TransformerTokenizer(spm, spm, {"</s>": 0, "<unk>": 1, "▁a": 2, "▁b": 3, "<pad>": 4})
    >>> preprocessor = TransformerSeq2SeqLMPreprocessor(
    ...     tokenizer, encoder_sequence_length=4, decoder_sequence_length=4)
    >>> x, y, w = preprocessor((["a b"], ["b"]))
    >>> x["encoder_token_ids"].tolist(), x["decoder_token_ids"].tolist()
    ([[2, 3, 0, 4]], [[4, 3, 4, 4]])
    >>> y.tolist(), w.tolist()
    ([[3, 0, 4, 4]], [[1.0, 1.0, 0.0, 0.0]])
    """

    tokenizer_cls = TransformerTokenizer
    family = "transformer"

    def __init__(
        self, tokenizer, encoder_sequence_length=512, decoder_sequence_length=512, decoder_start_token_id=None,
        padding=None, bucket_lengths=None,
    ):
        super().__init__(tokenizer, padding=padding, bucket_lengths=bucket_lengths)
        for name, length in (
            ("encoder_sequence_length", encoder_sequence_length),
            ("decoder_sequence_length", decoder_sequence_length),
        ):
            if not isinstance(length, int) or length < 1:
                raise ValueError(f"{name} must be a positive int (room for `</s>` at least); got {length!r}.")
        self.encoder_sequence_length = encoder_sequence_length
        self.decoder_sequence_length = decoder_sequence_length
        if decoder_start_token_id is None:
            decoder_start_token_id = tokenizer.pad_token_id
        self.decoder_start_token_id = decoder_start_token_id

    def get_config(self):
        return {
            **super().get_config(),
            "encoder_sequence_length": self.encoder_sequence_length,
            "decoder_sequence_length": self.decoder_sequence_length,
            "decoder_start_token_id": self.decoder_start_token_id,
        }

    def pack_sources(self, texts):
        """`{"encoder_token_ids", "encoder_padding_mask"}` of source texts
        (numpy int32, `(batch, width)`, the width at most
        `encoder_sequence_length`): the ids and `</s>`, right-padded with
        `<pad>`."""
        segments = self.segments(texts)
        if len(segments) != 1:
            raise ValueError(f"pack_sources takes the source texts only; got {len(segments)} lists.")
        if not segments[0]:
            raise ValueError("No source texts were given.")
        end = self.tokenizer.end_token_id
        rows = [ids[: self.encoder_sequence_length - 1] + [end] for ids in self.tokenizer.encode(segments[0])]
        width = self.batch_width(max(len(ids) for ids in rows), self.encoder_sequence_length)
        token_ids, padding_mask = _padded(rows, width, self.tokenizer.pad_token_id)
        return {"encoder_token_ids": token_ids, "encoder_padding_mask": padding_mask}

    def _pack_targets(self, texts):
        """`(decoder_token_ids, decoder_padding_mask, labels)` of target texts."""
        kept = [ids[: self.decoder_sequence_length - 1] for ids in self.tokenizer.encode_target(texts)]
        pad = self.tokenizer.pad_token_id
        width = self.batch_width(max((len(ids) + 1 for ids in kept), default=1), self.decoder_sequence_length)
        decoder_token_ids, padding_mask = _padded([[self.decoder_start_token_id] + ids for ids in kept], width, pad)
        labels, _ = _padded([ids + [self.tokenizer.end_token_id] for ids in kept], width, pad)
        return decoder_token_ids, padding_mask, labels

    def __call__(self, x, y=None, sample_weight=None):
        if y is not None:
            raise ValueError(
                "TransformerSeq2SeqLMPreprocessor takes no labels: they come from the targets. "
                "Pass x=(sources, targets)."
            )
        if not isinstance(x, tuple):
            if sample_weight is not None:
                raise ValueError("sample_weight needs targets to weigh: pass x=(sources, targets).")
            return self.pack_sources(x)
        if len(x) != 2:
            raise ValueError(f"Expected x=(sources, targets); got a tuple of {len(x)}.")
        sources, targets = self.segments(x[0])[0], self.segments(x[1])[0]
        if len(sources) != len(targets):
            raise ValueError(f"Got {len(sources)} sources but {len(targets)} targets; each source needs one target.")
        features = self.pack_sources(sources)
        decoder_token_ids, decoder_padding_mask, labels = self._pack_targets(targets)
        features.update(decoder_token_ids=decoder_token_ids, decoder_padding_mask=decoder_padding_mask)
        weights = decoder_padding_mask.astype("float32")
        weights = weighted(weights, sample_weight)
        return keras.utils.pack_x_y_sample_weight(features, labels, weights)
