"""Language-model data for Transformer-XL: text becomes one token stream,
cut into ordered segments whose memory carries over from batch to batch
(Dai et al., 2019, §3.2; the authors' `batchify`).

The stream of `n` tokens is split into `batch_size` contiguous streams (the
last `n mod batch_size` tokens are dropped), and each stream into segments
of `segment_length` inputs with the next tokens as labels:

    row b of batch k = stream_b[k·T : (k+1)·T],   labels = stream_b[k·T + 1 : (k+1)·T + 1]

so batch k + 1 continues every row of batch k. The last segment is padded
(weight 0). Each row's first segment is marked `reset_memory`: its memory
starts afresh.
"""

import numpy as np

from attention_zoo_keras.models.text_preprocessor import TextPreprocessor
from attention_zoo_keras.models.transformer_xl.transformer_xl_tokenizer import TransformerXLTokenizer
from attention_zoo_keras.registration import register


def stream_segments(stream, batch_size, segment_length, pad_id=0):
    """Ordered segment batches of a 1-D token stream (see the module docstring).

    Args:
        stream: 1-D int array. The whole text.
        batch_size: int. The number of parallel streams (rows of every
            batch).
        segment_length: int. The inputs per segment, `T`.
        pad_id: int. The id that pads the last segment (weight 0).

    Returns:
        `(features, labels, sample_weight)`: `features` a dict of
        `token_ids` `(segments · batch_size, T)` int32 and `reset_memory`
        `(segments · batch_size,)` bool, rows ordered so that batches of
        `batch_size` consecutive rows are consecutive segments; `labels`
        like `token_ids`; `sample_weight` float32, 0 on padding.

    Example:

    >>> features, labels, weights = stream_segments(np.arange(9), batch_size=2, segment_length=2)
    >>> features["token_ids"].tolist(), labels.tolist()
    ([[0, 1], [4, 5], [2, 0], [6, 0]], [[1, 2], [5, 6], [3, 0], [7, 0]])
    >>> weights.tolist(), features["reset_memory"].tolist()
    ([[1.0, 1.0], [1.0, 1.0], [1.0, 0.0], [1.0, 0.0]], [True, True, False, False])
    """
    stream = np.asarray(stream)
    if stream.ndim != 1:
        raise ValueError(f"A token stream is 1-D; got shape {stream.shape}.")
    if batch_size < 1 or segment_length < 1:
        raise ValueError(f"batch_size and segment_length must be positive; got {batch_size} and {segment_length}.")
    per_row = len(stream) // batch_size
    if per_row < 2:
        raise ValueError(
            f"A stream of {len(stream)} tokens is too short for {batch_size} parallel rows: each row needs at "
            "least 2 tokens (an input and its label). Use a smaller batch_size."
        )
    rows = stream[: per_row * batch_size].astype("int32").reshape(batch_size, per_row)
    num_segments = -(-(per_row - 1) // segment_length)
    padded_length = num_segments * segment_length
    inputs = np.full((batch_size, padded_length), pad_id, dtype="int32")
    labels = np.full((batch_size, padded_length), pad_id, dtype="int32")
    weights = np.zeros((batch_size, padded_length), dtype="float32")
    inputs[:, : per_row - 1] = rows[:, :-1]
    labels[:, : per_row - 1] = rows[:, 1:]
    weights[:, : per_row - 1] = 1.0

    def by_segment(array):
        segments = array.reshape(batch_size, num_segments, segment_length).transpose(1, 0, 2)
        return np.ascontiguousarray(segments.reshape(num_segments * batch_size, segment_length))

    reset = np.zeros(num_segments * batch_size, dtype=bool)
    reset[:batch_size] = True
    return {"token_ids": by_segment(inputs), "reset_memory": reset}, by_segment(labels), by_segment(weights)


@register
class TransformerXLCausalLMPreprocessor(TextPreprocessor):
    """Raw text to a Transformer-XL token stream and its ordered segments.

    Args:
        tokenizer: `TransformerXLTokenizer`. The tokenizer.
        sequence_length: int. The inputs per segment (`tgt_len`).
        add_end_token: bool. End every text with `<eos>`, as WikiText-103
            ends every line.

    Example:

    >>> tokenizer = TransformerXLTokenizer.from_vocabulary(["<eos>", "<unk>", "the", "cat", "sat"])
    >>> preprocessor = TransformerXLCausalLMPreprocessor(tokenizer, sequence_length=2)
    >>> preprocessor.stream(["the cat", "sat"]).tolist()
    [2, 3, 0, 4, 0]
    >>> features, labels, weights = preprocessor.segment_batches(["the cat", "sat"], batch_size=1)
    >>> features["token_ids"].tolist(), labels.tolist()
    ([[2, 3], [0, 4]], [[3, 0], [4, 0]])
    """

    tokenizer_cls = TransformerXLTokenizer
    family = "transformer_xl"
    default_padding = "max_length"  # every segment is sequence_length wide: the memory carries over

    def __init__(self, tokenizer, sequence_length=128, add_end_token=True):
        super().__init__(tokenizer)
        self.sequence_length = sequence_length
        self.add_end_token = add_end_token

    def get_config(self):
        return {"sequence_length": self.sequence_length, "add_end_token": self.add_end_token}

    def stream(self, x):
        """The token ids of raw text `x`, concatenated into one 1-D int32
        array (each text followed by `<eos>` with `add_end_token`)."""
        end = [self.tokenizer.end_token_id] if self.add_end_token else []
        ids = [token for encoded in self.tokenizer.encode(self.segments_of(x)) for token in encoded + end]
        return np.asarray(ids, dtype="int32")

    def segments_of(self, x):
        """The texts of raw input `x` (one string or a list)."""
        parts = self.segments(x)
        if len(parts) != 1:
            raise ValueError(f"Transformer-XL takes one text stream; got {len(parts)} segments per example.")
        return parts[0]

    def segment_batches(self, x, batch_size):
        """`stream_segments` of the stream of `x`, padded with `<eos>`."""
        return stream_segments(self.stream(x), batch_size, self.sequence_length, self.tokenizer.end_token_id)

    def __call__(self, x, y=None, sample_weight=None):
        raise TypeError(
            "Transformer-XL data is one ordered stream, not independent examples: use "
            "preprocessor.segment_batches(texts, batch_size), or pass the texts to the model's fit/evaluate."
        )
