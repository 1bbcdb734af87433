"""Pretraining data for ViLBERT (Lu et al., 2019, §3.2), as the authors
make it from Conceptual Captions (facebookresearch/vilbert-multi-task,
`concept_cap_dataset.BertPreprocessBatch`):

- alignment: with probability `mismatch_rate` (½) a caption is swapped for
  another one (label 1, "not aligned"), otherwise kept (label 0). The
  authors draw the other caption from the whole corpus; here it is another
  example's caption in the same batch.
- masked words: BERT's 15 % selection with 80/10/10 replacement
  (`BertMaskedLMPreprocessor`), on aligned and swapped captions alike.
- masked regions: each detected region is selected with probability
  `region_mask_rate` (15 %), and 90 % of the selected ones have their
  features zeroed; each selected region must predict the detector's class
  distribution there. The global region (the mean of the, partly zeroed,
  region features) is never selected. (The authors' mean divides by the
  number of regions that overlap no masked region; here by the number of
  regions.)
"""

import numpy as np

from attention_zoo_keras.models.bert.bert_masked_lm_preprocessor import BertMaskedLMPreprocessor
from attention_zoo_keras.models.bert.bert_tokenizer import BertTokenizer  # noqa: F401 (used by the doctest)
from attention_zoo_keras.models.text_preprocessor import as_text_list
from attention_zoo_keras.models.vilbert.vilbert_preprocessor import RAW_KEYS
from attention_zoo_keras.models.vilbert.vilbert_preprocessor import ViLBERTPreprocessor
from attention_zoo_keras.models.vilbert.vilbert_region_inputs import region_inputs
from attention_zoo_keras.registration import register

PRETRAINING_KEYS = RAW_KEYS + ("region_classes",)


@register
class ViLBERTPretrainerPreprocessor(ViLBERTPreprocessor):
    """Captioned images to masked, partly mismatched pretraining batches.

    Args:
        tokenizer: `BertTokenizer`. The tokenizer.
        sequence_length: int. The padded length of every caption.
        max_regions: int. The region slots per image, the global region
            included.
        mask_selection_rate: float. The share of the caption's tokens to
            predict.
        mask_selection_length: int or None. The most predicted tokens per
            caption (`None`: `sequence_length × mask_selection_rate`,
            rounded).
        mask_token_rate: float. Of the selected tokens, the share replaced
            by `[MASK]`.
        random_token_rate: float. Of the selected tokens, the share replaced
            by a random token.
        region_mask_rate: float. The share of the detected regions to
            predict.
        region_zero_rate: float. Of those, the share whose features are
            zeroed.
        mismatch_rate: float. The share of captions swapped for another
            example's.
        seed: int or None. The seed of all the randomness.
        padding: str or None. How wide a batch of captions is padded (see
            `ViLBERTPreprocessor`).
        bucket_lengths: list of int or None. The widths a batch of captions
            may be padded to (see `ViLBERTPreprocessor`).

    Call args:
        x: dict. As for `ViLBERTPreprocessor`, plus `"region_classes"`: per
            image, the detector's class distribution of each region, `(n,
            num_classes)` (rows sum to 1).

    Call returns `(features, targets, sample_weights)`: features with masked
    `token_ids`, `mask_positions` and masked `region_features`; targets and
    weights as `ViLBERTPretrainer` expects them (`token_logits`: the original
    ids, weight 1 on real predictions; `region_logits`: the class
    distributions, weight 1 on masked regions; `alignment_logits`: 0 aligned,
    1 swapped, weight 1).

    Example:

    >>> import numpy as np
    >>> vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "dog", "on", "grass", "red", "car"]
    >>> preprocessor = ViLBERTPretrainerPreprocessor(
    ...     BertTokenizer.from_vocabulary(vocab), sequence_length=8, max_regions=4, seed=0)
    >>> classes = np.full((3, 5), 0.2, "float32")
    >>> x, y, w = preprocessor({"text": ["a dog on grass", "a red car"],
    ...                         "regions": np.ones((2, 3, 6), "float32"),
    ...                         "boxes": np.tile(np.array([0, 0, 10, 10], "float32"), (2, 3, 1)),
    ...                         "image_size": (20, 20), "region_classes": [classes, classes]})
    >>> x["mask_positions"].shape, y["region_logits"].shape, w["region_logits"].shape
    ((2, 1), (2, 4, 5), (2, 4))
    """

    def __init__(
        self,
        tokenizer,
        sequence_length=36,
        max_regions=101,
        mask_selection_rate=0.15,
        mask_selection_length=None,
        mask_token_rate=0.8,
        random_token_rate=0.1,
        region_mask_rate=0.15,
        region_zero_rate=0.9,
        mismatch_rate=0.5,
        seed=None,
        padding=None,
        bucket_lengths=None,
    ):
        self.mask_selection_rate = mask_selection_rate
        self.mask_selection_length = mask_selection_length
        self.mask_token_rate = mask_token_rate
        self.random_token_rate = random_token_rate
        self.seed = seed
        super().__init__(
            tokenizer, sequence_length=sequence_length, max_regions=max_regions, padding=padding,
            bucket_lengths=bucket_lengths,
        )
        for name, rate in (
            ("region_mask_rate", region_mask_rate),
            ("region_zero_rate", region_zero_rate),
            ("mismatch_rate", mismatch_rate),
        ):
            if not 0 <= rate <= 1:
                raise ValueError(f"{name} must be between 0 and 1; got {rate}.")
        self.region_mask_rate = region_mask_rate
        self.region_zero_rate = region_zero_rate
        self.mismatch_rate = mismatch_rate
        # Offset from the text masking's generator (seeded with `seed`).
        self._rng = np.random.default_rng(None if seed is None else [seed, 1])

    def _text_preprocessor(self, tokenizer, padding, bucket_lengths):
        return BertMaskedLMPreprocessor(
            tokenizer,
            sequence_length=self.sequence_length,
            padding=padding,
            bucket_lengths=bucket_lengths,
            mask_selection_rate=self.mask_selection_rate,
            mask_selection_length=self.mask_selection_length,
            mask_token_rate=self.mask_token_rate,
            random_token_rate=self.random_token_rate,
            seed=self.seed,
        )

    def get_config(self):
        config = super().get_config()
        del config["task_id"]  # pretraining takes no task token
        config.update(
            {
                "mask_selection_rate": self.mask_selection_rate,
                "mask_selection_length": self.text.mask_selection_length,
                "mask_token_rate": self.mask_token_rate,
                "random_token_rate": self.random_token_rate,
                "region_mask_rate": self.region_mask_rate,
                "region_zero_rate": self.region_zero_rate,
                "mismatch_rate": self.mismatch_rate,
                "seed": self.seed,
            }
        )
        return config

    def count_examples(self, x):
        self._check_keys(x, PRETRAINING_KEYS)
        return super().count_examples(x)

    def _swap_captions(self, texts):
        """Captions with a `mismatch_rate` share swapped for another example's,
        and the alignment labels (1 where swapped)."""
        labels = np.zeros(len(texts), dtype="int32")
        if len(texts) < 2:
            return list(texts), labels
        swapped = list(texts)
        for row in np.flatnonzero(self._rng.random(len(texts)) < self.mismatch_rate):
            other = self._rng.integers(len(texts) - 1)
            other += other >= row  # any example but this one
            swapped[row] = texts[other]
            labels[row] = 1
        return swapped, labels

    def _mask_regions(self, features):
        """Per image: copies of the region features with the selected ones
        (partly) zeroed, and the selection (a bool per region)."""
        masked, selected = [], []
        for image in features:
            image = np.array(image, dtype="float32")
            chosen = self._rng.random(len(image)) < self.region_mask_rate
            zeroed = chosen & (self._rng.random(len(image)) < self.region_zero_rate)
            image[zeroed] = 0.0
            masked.append(image)
            selected.append(chosen)
        return masked, selected

    def __call__(self, x, y=None, sample_weight=None):
        self._check_keys(x, PRETRAINING_KEYS)
        texts, alignment = self._swap_captions(as_text_list(x["text"]))
        features = self.text.pack(texts)
        features, token_targets, token_weights = self.text.mask(features)
        region_features, selected = self._mask_regions(list(x["regions"]))
        regions = region_inputs(region_features, x["boxes"], x["image_size"], max_regions=self.max_regions)
        batch, slots = regions["region_mask"].shape
        if batch != len(texts):
            raise ValueError(f"Got {len(texts)} captions but {batch} images; ViLBERT pairs one caption with one image.")
        classes = [np.asarray(c, dtype="float32") for c in x["region_classes"]]
        num_classes = {c.shape[-1] for c in classes if c.ndim == 2}
        if len(num_classes) != 1 or any(c.ndim != 2 for c in classes):
            raise ValueError(
                "'region_classes' must hold one (regions, num_classes) distribution per image, with the same "
                f"num_classes for all; got shapes {[c.shape for c in classes]}."
            )
        region_targets = np.zeros((batch, slots, num_classes.pop()), dtype="float32")
        region_weights = np.zeros((batch, slots), dtype="float32")
        for row, (distribution, chosen) in enumerate(zip(classes, selected)):
            if len(distribution) != len(chosen):
                raise ValueError(
                    f"Image {row} has {len(chosen)} regions but {len(distribution)} rows of 'region_classes'."
                )
            # Slot 0 is the global region; the detected regions follow.
            region_targets[row, 1 : 1 + len(distribution)] = distribution
            region_weights[row, 1 : 1 + len(chosen)] = chosen
        features = {**features, **regions}
        targets = {"token_logits": token_targets, "region_logits": region_targets, "alignment_logits": alignment}
        weights = {
            "token_logits": token_weights,
            "region_logits": region_weights,
            "alignment_logits": np.ones(batch, dtype="float32"),
        }
        return features, targets, weights
