"""`TransformerSeq2SeqLMPreprocessor`: encoder inputs, teacher-forced decoder
inputs, labels and weights, by hand on a tiny vocabulary and against
`transformers`' Marian tokenizer and `shift_tokens_right`."""

import warnings

import numpy as np
import pytest

from attention_zoo_keras.models.transformer import TransformerSeq2SeqLMPreprocessor
from attention_zoo_keras.models.transformer import TransformerTokenizer
from attention_zoo_keras.tokenizers.sentencepiece_model import UNKNOWN
from attention_zoo_keras.tokenizers.sentencepiece_model import SentencePiece
from attention_zoo_keras.tokenizers.sentencepiece_model import SentencePieceModel
from attention_zoo_keras.tokenizers.sentencepiece_model import unigram_tokenizer
from tests.support.marian_texts import TEXTS


# Shared ids: </s> 0, <unk> 1, source words 2-4, target words 5-8, <pad> 9.
VOCABULARY = {
    "</s>": 0, "<unk>": 1, "▁the": 2, "▁cat": 3, "▁sat": 4,
    "▁le": 5, "▁chat": 6, "▁est": 7, "▁assis": 8, "<pad>": 9,
}
SOURCES = ["the cat sat", "the cat"]
TARGETS = ["le chat est assis", "le chat"]


def _side(*words):
    pieces = [SentencePiece("<unk>", 0.0, UNKNOWN)] + [SentencePiece(f"▁{word}", -1.0) for word in words]
    return unigram_tokenizer(SentencePieceModel(pieces=tuple(pieces)))


def _preprocessor(**kwargs):
    tokenizer = TransformerTokenizer(_side("the", "cat", "sat"), _side("le", "chat", "est", "assis"), VOCABULARY)
    lengths = {"encoder_sequence_length": 5, "decoder_sequence_length": 6}
    return TransformerSeq2SeqLMPreprocessor(tokenizer, **{**lengths, **kwargs})


def _lists(x, y, w):
    return {key: value.tolist() for key, value in x.items()}, y.tolist(), w.tolist()


def test_sources_and_targets_by_hand():
    x, y, w = _preprocessor()((SOURCES, TARGETS))

    assert {key: value.dtype for key, value in x.items()} == dict.fromkeys(
        ["encoder_token_ids", "encoder_padding_mask", "decoder_token_ids", "decoder_padding_mask"], np.int32
    )
    assert _lists(x, y, w) == (
        {
            "encoder_token_ids": [[2, 3, 4, 0, 9], [2, 3, 0, 9, 9]],
            "encoder_padding_mask": [[1, 1, 1, 1, 0], [1, 1, 1, 0, 0]],
            "decoder_token_ids": [[9, 5, 6, 7, 8, 9], [9, 5, 6, 9, 9, 9]],  # <pad> starts, as in Marian
            "decoder_padding_mask": [[1, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0]],
        },
        [[5, 6, 7, 8, 0, 9], [5, 6, 0, 9, 9, 9]],
        [[1.0, 1.0, 1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]],
    )


def test_truncation_keeps_the_end_token_of_sources_and_labels():
    x, y, w = _preprocessor(encoder_sequence_length=3, decoder_sequence_length=3)((SOURCES, TARGETS))

    assert x["encoder_token_ids"].tolist() == [[2, 3, 0], [2, 3, 0]]
    assert x["encoder_padding_mask"].tolist() == [[1, 1, 1], [1, 1, 1]]
    assert x["decoder_token_ids"].tolist() == [[9, 5, 6], [9, 5, 6]]
    assert y.tolist() == [[5, 6, 0], [5, 6, 0]]
    assert w.tolist() == [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]


def test_start_token_unknown_words_and_sample_weights():
    preprocessor = _preprocessor(decoder_start_token_id=0, encoder_sequence_length=4, decoder_sequence_length=4)

    x, y, w = preprocessor((["the dog", "a cat"], ["le chien", "chat"]), sample_weight=[2.0, 0.5])

    assert x["encoder_token_ids"].tolist() == [[2, 1, 0, 9], [1, 3, 0, 9]]
    assert x["decoder_token_ids"].tolist() == [[0, 5, 1, 9], [0, 6, 9, 9]]
    assert y.tolist() == [[5, 1, 0, 9], [6, 0, 9, 9]]
    assert w.tolist() == [[2.0, 2.0, 2.0, 0.0], [0.5, 0.5, 0.0, 0.0]]


def test_sources_alone_give_the_encoder_features():
    preprocessor = _preprocessor()

    features = preprocessor(SOURCES)

    assert sorted(features) == ["encoder_padding_mask", "encoder_token_ids"]
    for key, value in preprocessor.pack_sources(SOURCES).items():
        np.testing.assert_array_equal(features[key], value)
    assert preprocessor("the cat")["encoder_token_ids"].tolist() == [[2, 3, 0, 9, 9]]
    assert preprocessor.num_examples((SOURCES, TARGETS)) == 2


def test_config_resolves_the_start_token():
    config = _preprocessor().get_config()
    assert config == {
        "encoder_sequence_length": 5, "decoder_sequence_length": 6, "decoder_start_token_id": 9,
        "padding": "buckets", "bucket_lengths": None,
    }


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda p: p((SOURCES, TARGETS), y=[1, 2]), ValueError, r"takes no labels.*x=\(sources, targets\)"),
        (lambda p: p(SOURCES, y=TARGETS), ValueError, r"takes no labels"),
        (lambda p: p((SOURCES, TARGETS[:1])), ValueError, r"Got 2 sources but 1 targets"),
        (lambda p: p(([], [])), ValueError, r"No source texts were given"),
        (lambda p: p([]), ValueError, r"No source texts were given"),
        (lambda p: p((SOURCES, TARGETS, TARGETS)), ValueError, r"Expected x=\(sources, targets\); got a tuple of 3"),
        (lambda p: p(SOURCES, sample_weight=[1.0, 1.0]), ValueError, r"sample_weight needs targets"),
        (lambda p: p(([1, 2], TARGETS)), TypeError, r"Text 0 is a value of type int \(1\), not a string"),
        (lambda p: p.pack_sources((SOURCES, TARGETS)), ValueError, r"takes the source texts only"),
    ],
    ids=[
        "labels", "targets-as-labels", "mismatched", "empty-pair", "empty", "triple", "weights-alone", "not-text",
        "pair-to-pack",
    ],
)
def test_clear_errors(call, error, message):
    with pytest.raises(error, match=message):
        call(_preprocessor())


@pytest.mark.parametrize("lengths", [(0, 5), (5, 0), (5, 2.5)])
def test_sequence_lengths_must_hold_the_end_token(lengths):
    with pytest.raises(ValueError, match=r"sequence_length must be a positive int"):
        _preprocessor(encoder_sequence_length=lengths[0], decoder_sequence_length=lengths[1])


def test_teacher_forcing_matches_transformers(tiny_marian_tokenizer_files):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.models.marian.modeling_marian import shift_tokens_right

    files = tiny_marian_tokenizer_files
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Recommended: pip install sacremoses."
        marian = transformers.MarianTokenizer.from_pretrained(str(files))
    tokenizer = TransformerTokenizer.from_marian(files / "source.spm", files / "target.spm", files / "vocab.json")
    preprocessor = TransformerSeq2SeqLMPreprocessor(tokenizer, encoder_sequence_length=16, decoder_sequence_length=12)
    sources, targets = TEXTS[:60], TEXTS[60:120]  # some longer than the sequences, some empty

    x, y, w = preprocessor((sources, targets))

    inputs = marian(sources, max_length=16, truncation=True, padding="max_length")
    labels = marian(text_target=targets, max_length=12, truncation=True, padding="max_length")
    np.testing.assert_array_equal(x["encoder_token_ids"], inputs["input_ids"])
    np.testing.assert_array_equal(x["encoder_padding_mask"], inputs["attention_mask"])
    np.testing.assert_array_equal(y, labels["input_ids"])
    np.testing.assert_array_equal(w, labels["attention_mask"])
    assert (w[:, -1] == 1).any() and (w[:, -1] == 0).any()  # truncated and padded labels both
    decoder_input_ids = shift_tokens_right(
        torch.tensor(labels["input_ids"]), marian.pad_token_id, decoder_start_token_id=marian.pad_token_id
    ).numpy()
    mask = x["decoder_padding_mask"].astype(bool)
    np.testing.assert_array_equal(mask, w.astype(bool))
    np.testing.assert_array_equal(x["decoder_token_ids"][mask], decoder_input_ids[mask])
    # Past the last label transformers feeds `</s>`; here it is padding, masked either way.
    assert (x["decoder_token_ids"][~mask] == tokenizer.pad_token_id).all()
