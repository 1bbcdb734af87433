"""A converted `transformers` MarianMTModel against the original: logits,
greedy and beam-search translations token for token."""

import numpy as np
import pytest
import torch
import transformers
from keras import ops

from attention_zoo_keras.models.transformer import TransformerSeq2SeqLM

SOURCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Attention is all you need.",
    "Where is the old bridge?",
]
MAX_LENGTH = 12


@pytest.fixture(scope="module")
def reference(tiny_marian_checkpoint):
    tokenizer = transformers.MarianTokenizer.from_pretrained(tiny_marian_checkpoint)
    model = transformers.MarianMTModel.from_pretrained(tiny_marian_checkpoint).eval()
    return tokenizer, model


@pytest.fixture(scope="module")
def mt(tiny_marian_checkpoint):
    return TransformerSeq2SeqLM.from_preset(str(tiny_marian_checkpoint))


def _reference_generate(reference, **options):
    tokenizer, model = reference
    batch = tokenizer(SOURCES, return_tensors="pt", padding=True)
    with torch.no_grad():
        output = model.generate(
            **batch, max_length=MAX_LENGTH, do_sample=False, bad_words_ids=[[tokenizer.pad_token_id]], **options
        )
    rows = []
    for row in output.tolist():  # the start token (<pad>), then tokens up to </s>, then <pad> padding
        rows.append(row[:1] + [token for token in row[1:] if token != tokenizer.pad_token_id])
    return rows


def test_logits_match(mt, reference):
    tokenizer, model = reference
    batch = tokenizer(SOURCES, text_target=["Der Hund.", "Ein kleiner Frosch saß.", "Wo?"], return_tensors="pt",
                      padding=True)
    labels = batch.pop("labels")
    decoder_input_ids = transformers.models.marian.modeling_marian.shift_tokens_right(
        labels, model.config.pad_token_id, model.config.decoder_start_token_id
    )
    decoder_mask = (labels != tokenizer.pad_token_id).long()
    with torch.no_grad():
        expected = model(**batch, decoder_input_ids=decoder_input_ids, decoder_attention_mask=decoder_mask).logits
    logits = mt({
        "encoder_token_ids": batch["input_ids"].numpy().astype("int32"),
        "encoder_padding_mask": batch["attention_mask"].numpy().astype("int32"),
        "decoder_token_ids": decoder_input_ids.numpy().astype("int32"),
        "decoder_padding_mask": decoder_mask.numpy().astype("int32"),
    })
    real = decoder_mask.numpy().astype(bool)
    np.testing.assert_allclose(ops.convert_to_numpy(logits)[real], expected.numpy()[real], atol=1e-4)


def test_our_preprocessor_gives_their_features(mt, reference):
    tokenizer, _ = reference
    features = mt.preprocessor.pack_sources(SOURCES)
    expected = tokenizer(SOURCES)["input_ids"]
    for row, ids in enumerate(expected):
        assert features["encoder_token_ids"][row][: len(ids)].tolist() == ids
        assert features["encoder_padding_mask"][row].sum() == len(ids)


def _stop_token(reference):
    """A token the second source's greedy translation emits midway (not at
    its first step), so that stopping on it gives rows of different lengths."""
    row = _reference_generate(reference, num_beams=1)[1]
    return next(token for token in row[2:] if token not in row[:2])


def _rows(output):
    return [ids[mask.astype(bool)].tolist() for ids, mask in zip(output["token_ids"], output["padding_mask"])]


@pytest.mark.parametrize("with_stop", [False, True])
def test_greedy_generation_matches(mt, reference, with_stop):
    stops = [0, _stop_token(reference)] if with_stop else [0]
    expected = _reference_generate(reference, num_beams=1, eos_token_id=stops)
    assert len({len(row) for row in expected}) > 1 or not with_stop
    ours = mt.generate(mt.preprocessor.pack_sources(SOURCES), max_length=MAX_LENGTH, stop_token_ids=stops)
    assert _rows(ours) == expected
    if not with_stop:
        texts = mt.generate(SOURCES, max_length=MAX_LENGTH)
        assert texts == reference[0].batch_decode([torch.tensor(row) for row in expected], skip_special_tokens=True)


@pytest.mark.parametrize(
    "num_beams, length_penalty, early_stopping, with_stop",
    [(4, 0.6, False, False), (4, 0.6, False, True), (3, 1.0, True, True), (2, 2.0, "never", True)],
)
def test_beam_search_matches(mt, reference, num_beams, length_penalty, early_stopping, with_stop):
    stops = [0, _stop_token(reference)] if with_stop else [0]
    options = dict(num_beams=num_beams, length_penalty=length_penalty, early_stopping=early_stopping)
    expected = _reference_generate(reference, eos_token_id=stops, **options)
    ours = mt.generate(
        mt.preprocessor.pack_sources(SOURCES), max_length=MAX_LENGTH, stop_token_ids=stops, **options
    )
    assert _rows(ours) == expected
