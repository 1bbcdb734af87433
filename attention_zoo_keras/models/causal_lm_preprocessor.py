"""Causal-LM data: raw text to inputs, next-token labels and weights.

    x = ids[:-1],  y = ids[1:],  weight = mask[1:]

Padding gets weight 0, so it never counts in the loss or the metrics.
"""

import keras

from attention_zoo_keras.models.preprocessor import weighted
from attention_zoo_keras.models.text_preprocessor import PackedTextPreprocessor


class CausalLMPreprocessor(PackedTextPreprocessor):
    """Raw strings to `token_ids` and `padding_mask` (see
    `PackedTextPreprocessor` for the arguments), with the next tokens as
    labels; a family sets `tokenizer_cls` and `family`.

    Call returns `(features, labels, sample_weight)`: `features` with
    `token_ids` and `padding_mask` `(batch, width)` (`width` the batch's
    bucket length, at most `sequence_length`; `sequence_length` with
    `padding="max_length"`); `labels` the ids one position on, as wide;
    `sample_weight` 1 where the label is a real token, 0 on padding (times
    a given per-example `sample_weight`).
    """

    def __call__(self, x, y=None, sample_weight=None):
        if y is not None:
            raise ValueError(
                f"{type(self).__name__} takes no labels: they are the text's next tokens. Pass only the texts."
            )
        packed = self.pack(x, shift=1)
        features = {key: value[:, :-1] for key, value in packed.items()}
        labels = packed["token_ids"][:, 1:]
        weights = packed["padding_mask"][:, 1:].astype("float32")
        weights = weighted(weights, sample_weight)
        return keras.utils.pack_x_y_sample_weight(features, labels, weights)
