"""Masked-LM data for the Reformer encoder (Kitaev et al., 2020): raw text
to masked inputs, the original ids as labels, and weights on the masked
positions only.

Of the real, non-special tokens of each text a share `mask_selection_rate`
is selected (at least one); of those, a share `mask_token_rate` becomes
the mask id, a share `random_token_rate` a random non-special id, and the
rest stay as they are (BERT's 80/10/10 scheme by default; Devlin et al.,
2019, §3.1). The model predicts the original ids at the selected positions:

    labels = ids,   weight_t = 1 if t was selected else 0

**The mask id.** Neither Reformer vocabulary has a mask token (`[MASK]`):
crime-and-punishment's SentencePiece pieces have `<unk>`, `<s>` and
`</s>`, the enwik8 bytes `<pad>` and `<EOS>`. By default masked positions
get an existing id that carries no text of its own: `<unk>` (SentencePiece:
it only stands for characters the pieces cannot spell, and is never
selected for prediction) or `<pad>` (bytes: it never occurs in a text;
padding is masked out of the attention by `padding_mask`, a masked position
is not). Reusing an id keeps the vocabulary, and so a checkpoint's
embedding table and `lm_head`, as they are; a new id would need both
resized. A vocabulary extended by a dedicated mask token passes its id as
`mask_token_id`; `mask_token_rate=0` with `random_token_rate=1` masks by
random replacement only, with no mask id at all.
"""

import keras
import numpy as np

from attention_zoo_keras.models.preprocessor import weighted
from attention_zoo_keras.models.reformer.reformer_preprocessor import ReformerPreprocessor
from attention_zoo_keras.registration import register


def mask_tokens(
    token_ids, candidates, rng, selection_rate, mask_token_id, mask_token_rate, random_token_rate, random_ids
):
    """BERT-style masking over whole sequences.

    Args:
        token_ids: int array of shape `(batch, length)`. The token ids.
        candidates: bool array of shape `(batch, length)`. The positions
            that may be selected.
        rng: `numpy.random.Generator`. The randomness.
        selection_rate: float. The share of each row's candidates to select
            (at least one).
        mask_token_id: int. The id a masked position gets.
        mask_token_rate: float. The share of the selected positions that
            become `mask_token_id`.
        random_token_rate: float. The share of the selected positions that
            become a random id of `random_ids`; the rest keep their ids.
        random_ids: int array. The ids random replacement draws from.

    Returns:
        `(masked token_ids, float32 weights)`, the weights 1 at the selected
        positions and 0 elsewhere.

    >>> ids, weights = mask_tokens(np.array([[5, 6, 7, 8]]), np.array([[True, True, True, False]]),
    ...                            np.random.default_rng(0), 0.5, 0, 1.0, 0.0, np.arange(2, 9))
    >>> weights.tolist()[0][3], ids[weights == 1].tolist(), sorted(set(ids[weights == 0].tolist()) - {5, 6, 7, 8})
    (0.0, [0, 0], [])
    """
    token_ids = np.array(token_ids, dtype="int32")
    weights = np.zeros(token_ids.shape, dtype="float32")
    for row in range(token_ids.shape[0]):
        positions = np.flatnonzero(candidates[row])
        if positions.size == 0:
            continue
        count = min(positions.size, max(1, round(positions.size * selection_rate)))
        chosen = rng.choice(positions, size=count, replace=False)
        weights[row, chosen] = 1.0
        action = rng.random(count)
        to_mask = chosen[action < mask_token_rate]
        to_randomize = chosen[(action >= mask_token_rate) & (action < mask_token_rate + random_token_rate)]
        token_ids[row, to_mask] = mask_token_id
        token_ids[row, to_randomize] = rng.choice(random_ids, size=to_randomize.size)
    return token_ids, weights


@register
class ReformerMaskedLMPreprocessor(ReformerPreprocessor):
    """Raw text to masked Reformer inputs, the original ids, and weights on
    the masked positions.

    Args:
        tokenizer: `ReformerTokenizer` or `ReformerByteTokenizer`. The
            tokenizer.
        sequence_length: int. The length of every example (see
            `ReformerPreprocessor`: to train, a multiple of the chunk
            lengths, and with axial positions exactly `n₁·n₂`).
        add_start_token: bool. As in `ReformerPreprocessor`.
        add_end_token: bool. As in `ReformerPreprocessor`.
        mask_selection_rate: float. The share of the real, non-special
            tokens to predict.
        mask_token_id: int or None. The id masked positions get; `None`: the
            tokenizer's `<unk>` (SentencePiece) or `<pad>` (bytes), see the
            module notes.
        mask_token_rate: float. Of the selected tokens, the share replaced
            by the mask id.
        random_token_rate: float. The share replaced by a random non-special
            id.
        seed: int or None. The seed of the masking randomness (`None`: fresh
            each run).
        padding: str or None. As in `ReformerPreprocessor` (every batch
            `sequence_length` wide by default).
        bucket_lengths: list of int or None. As in `ReformerPreprocessor`.

    Call returns `(features, labels, sample_weight)`: `features` with the
    masked `token_ids` and the `padding_mask`, `(batch, sequence_length)`;
    `labels` the original ids; `sample_weight` 1 at the selected positions,
    0 elsewhere (times a given per-example `sample_weight`).

    Example:

    >>> from attention_zoo_keras.models.reformer.reformer_tokenizer import ReformerByteTokenizer
    >>> preprocessor = ReformerMaskedLMPreprocessor(ReformerByteTokenizer(), sequence_length=8,
    ...                                             mask_selection_rate=0.5, mask_token_rate=1.0,
    ...                                             random_token_rate=0.0, seed=0)
    >>> x, y, w = preprocessor(["abcd"])
    >>> y.tolist(), float(w.sum()), bool((x["token_ids"][w == 1] == preprocessor.mask_token_id).all())
    ([[99, 100, 101, 102, 1, 0, 0, 0]], 2.0, True)
    """

    def __init__(
        self,
        tokenizer,
        sequence_length=1024,
        add_start_token=False,
        add_end_token=True,
        mask_selection_rate=0.15,
        mask_token_id=None,
        mask_token_rate=0.8,
        random_token_rate=0.1,
        seed=None,
        padding=None,
        bucket_lengths=None,
    ):
        super().__init__(
            tokenizer, sequence_length=sequence_length, add_start_token=add_start_token,
            add_end_token=add_end_token, padding=padding, bucket_lengths=bucket_lengths,
        )
        if not 0 < mask_selection_rate <= 1:
            raise ValueError(f"mask_selection_rate must be in (0, 1]; got {mask_selection_rate}.")
        if min(mask_token_rate, random_token_rate) < 0 or mask_token_rate + random_token_rate > 1:
            raise ValueError(
                "mask_token_rate and random_token_rate must be non-negative with a sum of at most 1; got "
                f"{mask_token_rate} and {random_token_rate}."
            )
        if mask_token_id is not None and not 0 <= mask_token_id < tokenizer.vocabulary_size:
            raise ValueError(
                f"mask_token_id {mask_token_id} is outside the vocabulary of {tokenizer.vocabulary_size} ids."
            )
        self.mask_selection_rate = mask_selection_rate
        self.mask_token_rate = mask_token_rate
        self.random_token_rate = random_token_rate
        self.seed = seed
        self._mask_token_id = mask_token_id
        self._rng = np.random.default_rng(seed)
        self._random_ids = np.setdiff1d(np.arange(tokenizer.vocabulary_size), tokenizer.special_token_ids)

    @property
    def mask_token_id(self):
        """The id masked positions get: the one given, else the tokenizer's
        `<unk>` (SentencePiece) or `<pad>` (bytes)."""
        if self._mask_token_id is not None:
            return self._mask_token_id
        unknown = getattr(self.tokenizer, "unknown_token_id", None)
        return self.tokenizer.pad_token_id if unknown is None else unknown

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "mask_selection_rate": self.mask_selection_rate,
                "mask_token_id": self._mask_token_id,
                "mask_token_rate": self.mask_token_rate,
                "random_token_rate": self.random_token_rate,
                "seed": self.seed,
            }
        )
        return config

    def mask(self, features):
        """`(features with masked token_ids, labels, weights)` of packed
        `features` (new arrays; special tokens and padding are never selected)."""
        token_ids = features["token_ids"]
        candidates = (features["padding_mask"] == 1) & ~np.isin(token_ids, self.tokenizer.special_token_ids)
        masked, weights = mask_tokens(
            token_ids, candidates, self._rng, self.mask_selection_rate, self.mask_token_id,
            self.mask_token_rate, self.random_token_rate, self._random_ids,
        )
        return {**features, "token_ids": masked}, np.array(token_ids, dtype="int32"), weights

    def __call__(self, x, y=None, sample_weight=None):
        if y is not None:
            raise ValueError(
                f"{type(self).__name__} takes no labels: they are the text's own tokens. Pass only the texts."
            )
        features, labels, weights = self.mask(self.pack(x))
        weights = weighted(weights, sample_weight)
        return keras.utils.pack_x_y_sample_weight(features, labels, weights)
