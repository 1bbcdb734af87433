"""Bad raw inputs to preprocessors and tokenizers (texts that are not text,
images without pixels or with NaN, empty input, padding settings) and the
errors they get: a table of cases, each run by `test_bad_raw_input`. Each
used to be silent (`None` and numbers tokenized as the strings "None" and
"3", NaN images passed on, a label list of another length packed as it
was), another library's (`tokenizers`' `TypeError` on a lone surrogate) or
a crash (numpy's `need at least one array to stack` on no images)."""

import functools

import numpy as np
import pytest
from PIL import Image

from attention_zoo_keras.models import BertMaskedLMPreprocessor
from attention_zoo_keras.models import BertPreprocessor
from attention_zoo_keras.models import BertTokenizer
from attention_zoo_keras.models import GPTCausalLMPreprocessor
from attention_zoo_keras.models import GPTTokenizer
from attention_zoo_keras.models import TransformerSeq2SeqLMPreprocessor
from attention_zoo_keras.models import TransformerTokenizer
from attention_zoo_keras.models import TransformerXLCausalLMPreprocessor
from attention_zoo_keras.models import TransformerXLTokenizer
from attention_zoo_keras.models import ViLBERTPreprocessor
from attention_zoo_keras.models import ViTImageConverter

VOCABULARY = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "great", "film"]


@functools.cache
def _bert():
    return BertPreprocessor(BertTokenizer.from_vocabulary(VOCABULARY), sequence_length=8)


@functools.cache
def _gpt():
    vocabulary = {"<|endoftext|>": 0, "a": 1, "b": 2, "Ġ": 3, "ab": 4, "Ġab": 5}
    return GPTCausalLMPreprocessor(GPTTokenizer.from_vocabulary(vocabulary, [("a", "b"), ("Ġ", "ab")]), sequence_length=4)


@functools.cache
def _seq2seq():
    tokenizer = TransformerTokenizer.from_characters("abc ")
    return TransformerSeq2SeqLMPreprocessor(tokenizer, encoder_sequence_length=8, decoder_sequence_length=8)


@functools.cache
def _transformer_xl():
    tokenizer = TransformerXLTokenizer.from_vocabulary(["<eos>", "<unk>", "the", "cat"])
    return TransformerXLCausalLMPreprocessor(tokenizer, sequence_length=2)


@functools.cache
def _vilbert():
    return ViLBERTPreprocessor(BertTokenizer.from_vocabulary(VOCABULARY), sequence_length=8, max_regions=3)


@functools.cache
def _vit():
    return ViTImageConverter(image_size=4)


def _vilbert_input(text):
    return {"text": text, "regions": [np.ones((1, 2), "float32")], "boxes": [np.array([[0, 0, 2, 2]], "float32")],
            "image_size": (4, 4)}


def _image(value, shape=(3, 3, 3)):
    image = np.zeros(shape, "float32")
    image.flat[4] = value
    return image


CASES = [
    # --- text that is not text: named by position and type, never tokenized as "None" / "3"
    ("bert-none-item", lambda: _bert()(["a film", None, 3]), TypeError, r"Text 1 is None, not a string"),
    ("bert-int-item", lambda: _bert()(["a film", "a", 3]), TypeError, r"Text 2 is a value of type int \(3\)"),
    ("bert-float-item", lambda: _bert()(["a", 2.5]), TypeError, r"Text 1 is a value of type float \(2\.5\)"),
    ("bert-bool-item", lambda: _bert()([True, "a"]), TypeError, r"Text 0 is a value of type bool \(True\)"),
    ("bert-object-array-none", lambda: _bert()(np.array(["a", None], dtype=object)), TypeError,
     r"Text 1 is None"),
    ("bert-pair-none", lambda: _bert()((["a"], [None])), TypeError, r"Second text 0 is None"),
    ("bert-lone-surrogate", lambda: _bert()(["a film", "a \ud800 film"]), ValueError,
     r"Text 1 is not valid Unicode: it holds the lone surrogate '\\ud800' at character 2"),
    ("bert-bytes-not-utf8", lambda: _bert()([b"\xff\xfe"]), ValueError, r"Text 0 is bytes that are not valid UTF-8"),
    ("bert-2d-array", lambda: _bert()(np.array([["a great film", "a"], ["a film", "great"]])), ValueError,
     r"Got a \(2, 2\) array as text: give one text per example .* a tuple \(first texts, second texts\)"),
    ("bert-2d-array-count", lambda: _bert().num_examples(np.array([["a", "film"], ["a", "great"]])), ValueError,
     r"Got a \(2, 2\) array as text"),
    ("bert-not-text-at-all", lambda: _bert()({"text": "a"}), TypeError,
     r"BertPreprocessor takes a string, a list of strings, or a tuple of lists"),
    ("gpt-none-item", lambda: _gpt()(["ab", None]), TypeError, r"Text 1 is None"),
    ("seq2seq-target-number", lambda: _seq2seq()((["ab", "ba"], ["ab", 7])), TypeError,
     r"Text 1 is a value of type int \(7\)"),
    ("seq2seq-source-surrogate", lambda: _seq2seq()(["a\udfffb"]), ValueError,
     r"Text 0 is not valid Unicode: it holds the lone surrogate '\\udfff'"),
    ("transformer-xl-none-item", lambda: _transformer_xl().stream(["the cat", None]), TypeError, r"Text 1 is None"),
    ("vilbert-number-text", lambda: _vilbert()(_vilbert_input([5])), TypeError,
     r"Text 0 is a value of type int \(5\)"),
    ("tokenizer-single-string", lambda: _bert().tokenizer.encode("a film"), TypeError,
     r"Expected a list of texts; got one str\. Wrap it in a list"),
    ("tokenizer-none-item", lambda: _bert().tokenizer.encode(["a", None]), TypeError, r"Text 1 is None"),
    ("tokenizer-target-surrogate", lambda: _seq2seq().tokenizer.encode_target(["\ud800"]), ValueError,
     r"Target text 0 is not valid Unicode"),
    # --- pairs and labels of another length
    ("bert-pair-lengths-differ", lambda: _bert()((["a", "film"], ["a"])), ValueError,
     r"The segments hold different numbers of examples: \[2, 1\]"),
    ("seq2seq-sources-targets-differ", lambda: _seq2seq()((["ab", "ba"], ["ab"])), ValueError,
     r"Got 2 sources but 1 targets"),
    ("bert-labels-length-differs", lambda: _bert()(["a", "film"], [1]), ValueError,
     r"y must have one entry per example: there are 2 examples but y is 1 entries"),
    ("bert-scalar-label", lambda: _bert()(["a", "film"], 1), ValueError, r"there are 2 examples but y is a scalar"),
    ("gpt-sample-weight-length-differs", lambda: _gpt()(["ab", "ab ab"], sample_weight=[1.0]), ValueError,
     r"sample_weight must have one entry per example: there are 2 examples but sample_weight is 1 entries"),
    ("vit-labels-length-differs", lambda: _vit()([_image(0.0)], [0, 1]), ValueError,
     r"there are 1 examples but y is 2 entries"),
    # --- images without pixels, or with values that are not finite
    ("vit-nan", lambda: _vit()([_image(np.nan)]), ValueError,
     r"Image 0 holds nan at \(row, column, channel\) = \(0, 1, 1\); pixel values must be finite"),
    ("vit-inf-in-batch", lambda: _vit()(np.stack([_image(0.0), _image(np.inf)])), ValueError,
     r"Image 1 holds inf at"),
    ("vit-minus-inf-grayscale", lambda: _vit()([_image(-np.inf, shape=(3, 3))]), ValueError,
     r"Image 0 holds -inf at \(row, column\) = \(1, 1\)"),
    ("vit-zero-by-zero", lambda: _vit()([np.zeros((0, 0, 3), "uint8")]), ValueError,
     r"Image 0 has shape \(0, 0, 3\): it holds no pixels"),
    ("vit-zero-height", lambda: _vit()([_image(0.0), np.zeros((0, 5, 3), "float32")]), ValueError,
     r"Image 1 has shape \(0, 5, 3\): it holds no pixels"),
    ("vit-empty-pil-image", lambda: _vit()([Image.new("RGB", (0, 0))]), ValueError, r"Image 0 has shape \(0, 0, 3\)"),
    # --- no examples at all (what `predict([])` / `predict(None)` hand the preprocessor)
    ("bert-no-texts", lambda: _bert().num_examples([]), ValueError,
     r"BertPreprocessor got an empty list: the raw input holds no example"),
    ("bert-none-input", lambda: _bert().num_examples(None), ValueError, r"BertPreprocessor got None instead of raw input"),
    ("vit-no-images", lambda: _vit().num_examples([]), ValueError, r"ViTImageConverter got an empty list"),
    ("vit-call-no-images", lambda: _vit()(np.zeros((0, 4, 4, 3), "float32")), ValueError,
     r"ViTImageConverter got an empty ndarray"),
    ("vilbert-no-texts", lambda: _vilbert().num_examples(_vilbert_input([])), ValueError,
     r"ViLBERTPreprocessor got an empty dict: the raw input holds no example"),
    # --- padding settings
    ("padding-misspelled", lambda: BertPreprocessor(_bert().tokenizer, padding="max_len"), ValueError,
     r"padding must be one of 'buckets', 'max_length'; got 'max_len'\. Did you mean: max_length\?"),
    ("bucket-lengths-with-max-length",
     lambda: BertPreprocessor(_bert().tokenizer, padding="max_length", bucket_lengths=[16]), ValueError,
     r"bucket_lengths applies to padding='buckets' only"),
    ("bucket-lengths-not-positive", lambda: GPTCausalLMPreprocessor(_gpt().tokenizer, bucket_lengths=[0, 16]),
     ValueError, r"bucket_lengths must be a non-empty list of positive ints; got \[0, 16\]"),
    ("bucket-lengths-empty",
     lambda: BertMaskedLMPreprocessor(_bert().tokenizer, sequence_length=8, bucket_lengths=[]), ValueError,
     r"bucket_lengths must be a non-empty list of positive ints; got \[\]"),
]


@pytest.mark.parametrize(("call", "error", "message"), [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_bad_raw_input(call, error, message):
    with pytest.raises(error, match=message):
        call()
