"""Raw ViLBERT inputs — text and an image's detected regions — to the
backbone's features: the text packed as BERT packs it (`[CLS] text [SEP]`,
segment ids, padding mask), the regions as `region_inputs` builds them
(normalised boxes, the global image region first, padding and mask up to
`max_regions`)."""

import numpy as np

from attention_zoo_keras.models.bert.bert_preprocessor import BertPreprocessor
from attention_zoo_keras.models.bert.bert_tokenizer import BertTokenizer
from attention_zoo_keras.models.preprocessed_batches import take
from attention_zoo_keras.models.preprocessor import Preprocessor
from attention_zoo_keras.models.text_preprocessor import as_text_batch
from attention_zoo_keras.models.text_preprocessor import as_text_list
from attention_zoo_keras.models.vilbert.vilbert_region_inputs import region_inputs
from attention_zoo_keras.registration import register

RAW_KEYS = ("text", "regions", "boxes", "image_size")


def _is_one_image_size(image_size):
    """Whether `image_size` is one `(height, width)` rather than one per image."""
    return len(image_size) == 2 and all(np.ndim(side) == 0 for side in image_size)


@register
class ViLBERTPreprocessor(Preprocessor):
    """Texts and detector regions to a `ViLBERTBackbone`'s feature dict.

    Args:
        tokenizer: `BertTokenizer`. The authors use bert-base-uncased's.
        sequence_length: int. The most tokens a text holds (longer texts are
            truncated).
        max_regions: int. The region slots per image, the global region
            included (the authors' `max_region_num`, 101: 100 boxes and the
            image).
        task_id: int or None. For a backbone with task tokens (the authors'
            multi-task model), the task every example is for (their
            `task_id`: 1 VQA, 8 Flickr30k retrieval, 11 RefCOCO, 15 GQA,
            ...); adds `task_ids`.
        padding: str or None. How wide a batch of texts is padded, as in
            `BertPreprocessor` (by default to the smallest power of two from
            16 that holds the longest text, at most `sequence_length`).
        bucket_lengths: list of int or None. The widths a batch may be
            padded to, as in `BertPreprocessor`.

    Call args:
        x: dict. `"text"` (a string or a list of strings),
            `"regions"` (per image, an `(n, feature_dim)` array of detector
            features: a list, or one `(batch, n, feature_dim)` array),
            `"boxes"` (per image, `(n, 4)` pixel boxes `x1, y1, x2, y2`) and
            `"image_size"` (`(height, width)` of every image, or a list of
            one per image).
        y: any or None. Passed through.
        sample_weight: any or None. Passed through.

    Example:

    >>> import numpy as np
    >>> vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "what", "colour", "is", "the", "sofa", "?"]
    >>> preprocessor = ViLBERTPreprocessor(BertTokenizer.from_vocabulary(vocab), sequence_length=8, max_regions=4)
    >>> x = preprocessor({"text": ["what colour is the sofa?"],
    ...                   "regions": [np.ones((2, 6), "float32")],
    ...                   "boxes": [np.array([[0, 0, 50, 40], [10, 10, 100, 80]], "float32")],
    ...                   "image_size": (80, 100)})
    >>> x["token_ids"].tolist(), x["region_mask"].tolist()
    ([[2, 5, 6, 7, 8, 9, 10, 3]], [[1, 1, 1, 0]])
    >>> x["region_boxes"][0, 1].tolist()
    [0.0, 0.0, 0.5, 0.5, 0.25]
    """

    tokenizer_cls = BertTokenizer
    family = "vilbert"

    def __init__(
        self, tokenizer, sequence_length=36, max_regions=101, task_id=None, padding=None, bucket_lengths=None
    ):
        super().__init__(tokenizer)
        self.sequence_length = sequence_length
        self.max_regions = max_regions
        self.task_id = task_id
        self.text = self._text_preprocessor(tokenizer, padding, bucket_lengths)

    def _text_preprocessor(self, tokenizer, padding, bucket_lengths):
        """The preprocessor that packs the texts."""
        return BertPreprocessor(
            tokenizer, sequence_length=self.sequence_length, padding=padding, bucket_lengths=bucket_lengths
        )

    def get_config(self):
        return {
            "sequence_length": self.sequence_length,
            "max_regions": self.max_regions,
            "task_id": self.task_id,
            "padding": self.text.padding,
            "bucket_lengths": self.text.bucket_lengths,
        }

    def is_raw(self, x):
        return isinstance(x, dict) and "text" in x and "token_ids" not in x

    def _check_keys(self, x, keys=RAW_KEYS):
        missing = [key for key in keys if key not in x]
        if missing:
            raise ValueError(
                f"{type(self).__name__} takes a dict of {', '.join(repr(k) for k in keys)}; "
                f"missing {', '.join(repr(k) for k in missing)}."
            )

    def count_examples(self, x):
        self._check_keys(x)
        return _checked_example_count(x, len(as_text_list(x["text"])), "example")

    def as_batch(self, x):
        """`x` with one text (a string) as a list of one."""
        return {**x, "text": as_text_batch(x["text"])}

    def examples(self, x, indices):
        x = self.as_batch(x)  # (a new dict)
        shared_size = _is_one_image_size(x["image_size"])
        image_size = x.pop("image_size")
        batch = take(x, indices)
        batch["image_size"] = image_size if shared_size else take(list(image_size), indices)
        return batch

    def pack(self, x):
        """The feature dict of raw input `x` (numpy arrays)."""
        self._check_keys(x)
        features = self.text.pack(x["text"])
        regions = region_inputs(x["regions"], x["boxes"], x["image_size"], max_regions=self.max_regions)
        batch, images = features["token_ids"].shape[0], regions["region_features"].shape[0]
        if batch != images:
            raise ValueError(f"Got {batch} texts but {images} images; ViLBERT pairs one text with one image.")
        features = {**features, **regions}
        if self.task_id is not None:
            features["task_ids"] = np.full((batch, 1), self.task_id, dtype="int32")
        return features

    def __call__(self, x, y=None, sample_weight=None):
        return self.with_labels(self.pack(x), y, sample_weight)


def _checked_example_count(x, num_texts, example):
    """`num_texts`, checked to be the number of entries of `x`'s regions,
    boxes and (unless one is shared) image sizes: one per `example` (no
    texts: 0, which `num_examples` refuses as empty input)."""
    if num_texts == 0:
        return 0
    counts = {"texts": num_texts, "entries of regions": len(x["regions"]), "of boxes": len(x["boxes"])}
    if not _is_one_image_size(x["image_size"]):
        counts["image sizes"] = len(x["image_size"])
    if len(set(counts.values())) > 1:
        listed = [f"{count} {what}" for what, count in counts.items()]
        raise ValueError(
            f"Got {', '.join(listed[:-1])} and {listed[-1]}; give one entry per {example}."
        )
    return num_texts


def _is_one_image_array(value):
    """Whether `value` is one image's `(n, dim)` array rather than a list (or
    a 3-D array) of candidate images' arrays."""
    return isinstance(value, np.ndarray) and value.ndim == 2


def _candidates(value, is_single):
    """`[value]` if `is_single(value)` (one item shared by all candidates),
    else the list of candidates `value`."""
    return None if is_single(value) else list(value)


@register
class ViLBERTRetrievalPreprocessor(ViLBERTPreprocessor):
    """Queries and their candidates to `ViLBERTImageTextRetriever` features
    `(batch, candidates, ...)`.

    Each example is one query with its candidates: a caption with candidate
    images (image retrieval) or an image with candidate captions (caption
    retrieval), or candidate pairs. Every example must have the same number
    of candidates.

    Args: as `ViLBERTPreprocessor`.

    Call args:
        x: dict. Like `ViLBERTPreprocessor`'s, one entry per example:
            `"text"`: a string (shared by the candidates) or a list of
            candidate strings; `"regions"` and `"boxes"`: one image's
            `(n, dim)` / `(n, 4)` arrays (shared) or a list of candidate
            images' arrays; `"image_size"`: one `(height, width)` for all,
            or per example one pair or a list of one per candidate.
        y: array of int or None. Passed through: the index
            of the matching candidate.
        sample_weight: any or None. Passed through.

    Example:

    >>> import numpy as np
    >>> vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "red", "car", "dog"]
    >>> preprocessor = ViLBERTRetrievalPreprocessor(BertTokenizer.from_vocabulary(vocab), sequence_length=6,
    ...                                             max_regions=3)
    >>> images = [np.ones((1, 4), "float32"), np.zeros((2, 4), "float32"), np.ones((2, 4), "float32")]
    >>> boxes = [np.array([[0, 0, 5, 5]] * len(image), "float32") for image in images]
    >>> x = preprocessor({"text": ["a red car"], "regions": [images], "boxes": [boxes], "image_size": (10, 10)})
    >>> x["token_ids"].shape, x["region_features"].shape
    ((1, 3, 6), (1, 3, 3, 4))
    """

    def count_examples(self, x):
        self._check_keys(x)
        return _checked_example_count(x, 1 if isinstance(x["text"], str) else len(x["text"]), "query")

    def pack(self, x):
        self._check_keys(x)
        texts = as_text_list(x["text"]) if isinstance(x["text"], str) else list(x["text"])
        shared_size = _is_one_image_size(x["image_size"])
        sizes = [x["image_size"]] * len(texts) if shared_size else list(x["image_size"])
        _checked_example_count(x, len(texts), "query")
        flat = {"text": [], "regions": [], "boxes": [], "image_size": []}
        counts = set()
        for example, (text, regions, boxes, size) in enumerate(zip(texts, x["regions"], x["boxes"], sizes)):
            candidates = {
                "text": _candidates(text, lambda value: isinstance(value, str)),
                "regions": _candidates(regions, _is_one_image_array),
                "boxes": _candidates(boxes, _is_one_image_array),
                "image_size": _candidates(size, _is_one_image_size),
            }
            lengths = {name: len(value) for name, value in candidates.items() if value is not None}
            if len(set(lengths.values())) > 1:
                raise ValueError(
                    f"Example {example} has different numbers of candidates: "
                    + ", ".join(f"{name}: {count}" for name, count in lengths.items())
                    + "."
                )
            count = next(iter(lengths.values()), 1)
            counts.add(count)
            shared = {"text": text, "regions": regions, "boxes": boxes, "image_size": size}
            for name, values in candidates.items():
                flat[name].extend(values if values is not None else [shared[name]] * count)
        if len(counts) > 1:
            raise ValueError(
                f"Every example must have the same number of candidates; got {sorted(counts)}. "
                "Score queries with different numbers of candidates in separate calls."
            )
        features = super().pack(flat)
        batch = len(texts)
        return {name: value.reshape(batch, -1, *value.shape[1:]) for name, value in features.items()}
