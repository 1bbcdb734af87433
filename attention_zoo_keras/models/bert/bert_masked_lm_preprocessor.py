"""Masked-LM data for BERT pretraining (Devlin et al., 2019, §3.1, Task 1):
of the selected 15 % of tokens, 80 % become `[MASK]`, 10 % a random token
and 10 % stay as they are; the model predicts the original tokens there.
"""

import numpy as np

from attention_zoo_keras.models.bert.bert_preprocessor import BertPreprocessor
from attention_zoo_keras.models.bert.bert_tokenizer import BertTokenizer  # noqa: F401 (used by the doctest)
from attention_zoo_keras.registration import register


@register
class BertMaskedLMPreprocessor(BertPreprocessor):
    """Raw text to masked inputs, the original ids and their weights.

    Args:
        tokenizer: `BertTokenizer`. The tokenizer.
        sequence_length: int. The most tokens an example holds.
        mask_selection_rate: float. The fraction of (non-special) tokens to
            predict.
        mask_selection_length: int or None. The most predictions per example;
            the output positions are padded to this length with weight 0.
            `None`: `round(sequence_length * mask_selection_rate)`, at least 1.
        mask_token_rate: float. Of the selected tokens, the share replaced by
            `[MASK]`.
        random_token_rate: float. The share replaced by a random vocabulary
            token.
        seed: int or None. The seed of the masking randomness.
        padding: str or None. How wide a batch is padded (see
            `BertPreprocessor`); `mask_positions` always has
            `mask_selection_length` entries.
        bucket_lengths: list of int or None. The widths a batch may be padded
            to (see `BertPreprocessor`).

    Call returns `(features, labels, sample_weight)`: features with the masked
    `token_ids` and `mask_positions`; `labels` the original ids at those
    positions; `sample_weight` 1 for real predictions, 0 for padding.

    Example:

    >>> vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "great", "film"]
    >>> tokenizer = BertTokenizer.from_vocabulary(vocab)
    >>> preprocessor = BertMaskedLMPreprocessor(tokenizer, sequence_length=8,
    ...                                         mask_selection_length=2, seed=0)
    >>> x, y, w = preprocessor(["a great film"])
    >>> x["mask_positions"].shape, y.shape, w.shape
    ((1, 2), (1, 2), (1, 2))
    """

    def __init__(
        self,
        tokenizer,
        sequence_length=512,
        mask_selection_rate=0.15,
        mask_selection_length=None,
        mask_token_rate=0.8,
        random_token_rate=0.1,
        seed=None,
        padding=None,
        bucket_lengths=None,
    ):
        super().__init__(tokenizer, sequence_length=sequence_length, padding=padding, bucket_lengths=bucket_lengths)
        if mask_token_rate + random_token_rate > 1:
            raise ValueError("mask_token_rate + random_token_rate must be at most 1.")
        self.mask_selection_rate = mask_selection_rate
        self.mask_selection_length = mask_selection_length or max(1, round(sequence_length * mask_selection_rate))
        self.mask_token_rate = mask_token_rate
        self.random_token_rate = random_token_rate
        self.seed = seed
        self._rng = np.random.default_rng(seed)
        special = np.array(tokenizer.special_token_ids)
        self._random_candidates = np.setdiff1d(np.arange(tokenizer.vocabulary_size), special)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "mask_selection_rate": self.mask_selection_rate,
                "mask_selection_length": self.mask_selection_length,
                "mask_token_rate": self.mask_token_rate,
                "random_token_rate": self.random_token_rate,
                "seed": self.seed,
            }
        )
        return config

    def mask(self, features):
        """Applies 80/10/10 masking to `features` (returns new arrays)."""
        token_ids = features["token_ids"].copy()
        batch = token_ids.shape[0]
        positions = np.zeros((batch, self.mask_selection_length), dtype="int32")
        labels = np.zeros((batch, self.mask_selection_length), dtype="int32")
        weights = np.zeros((batch, self.mask_selection_length), dtype="float32")
        special = np.isin(token_ids, self.tokenizer.special_token_ids)
        candidates_mask = (features["padding_mask"] == 1) & ~special
        for row in range(batch):
            candidates = np.flatnonzero(candidates_mask[row])
            if candidates.size == 0:
                continue
            count = min(self.mask_selection_length, max(1, round(candidates.size * self.mask_selection_rate)))
            chosen = np.sort(self._rng.choice(candidates, size=count, replace=False))
            positions[row, :count] = chosen
            labels[row, :count] = token_ids[row, chosen]
            weights[row, :count] = 1.0
            action = self._rng.random(count)
            to_mask = chosen[action < self.mask_token_rate]
            to_randomize = chosen[(action >= self.mask_token_rate) & (action < self.mask_token_rate + self.random_token_rate)]
            token_ids[row, to_mask] = self.tokenizer.mask_token_id
            token_ids[row, to_randomize] = self._rng.choice(self._random_candidates, size=to_randomize.size)
        return {**features, "token_ids": token_ids, "mask_positions": positions}, labels, weights

    def __call__(self, x, y=None, sample_weight=None):
        return self.mask(self.pack(x))
