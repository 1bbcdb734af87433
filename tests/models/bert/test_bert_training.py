"""Fine-tuning and pretraining from raw text actually learn."""

import keras
import numpy as np
import pytest

import attention_zoo_keras as azk
from tests.support.family_tests import run_task_test
from tests.support.tiny_checkpoints import TINY_VOCABULARY

POSITIVE = ["good", "great", "fine", "excellent", "wonderful"]
NEGATIVE = ["bad", "awful", "poor", "boring", "dull"]
FILLER = ["the", "film", "movie", "plot", "acting", "story", "was", "is", "very", "music"]


def sentiment_data(count, seed):
    """Texts whose label is whether their one opinion word is positive."""
    rng = np.random.default_rng(seed)
    texts, labels = [], []
    for _ in range(count):
        label = int(rng.integers(2))
        words = list(rng.choice(FILLER, size=rng.integers(2, 6)))
        words.insert(int(rng.integers(len(words) + 1)), rng.choice(POSITIVE if label else NEGATIVE))
        texts.append(" ".join(words))
        labels.append(label)
    return texts, np.array(labels)


def tiny_task(task_cls, preprocessor_cls, **kwargs):
    tokenizer = azk.models.BertTokenizer.from_vocabulary(TINY_VOCABULARY)
    backbone = azk.models.BertBackbone(
        vocabulary_size=tokenizer.vocabulary_size, num_layers=2, num_heads=2, hidden_dim=32,
        intermediate_dim=64, max_sequence_length=16, dropout=0.0, attention_dropout=0.0,
    )
    preprocessor = preprocessor_cls(tokenizer, sequence_length=16)
    return task_cls(backbone=backbone, preprocessor=preprocessor, **kwargs)


@pytest.mark.slow
def test_classifier_fit_on_raw_strings_learns_sentiment():
    keras.utils.set_random_seed(0)
    classifier = tiny_task(azk.models.BertTextClassifier, azk.models.BertPreprocessor, num_classes=2)
    classifier.compile(optimizer=keras.optimizers.Adam(1e-3))
    texts, labels = sentiment_data(256, seed=0)
    history = classifier.fit(texts, labels, batch_size=32, epochs=8, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0]
    test_texts, test_labels = sentiment_data(100, seed=1)
    predictions = classifier.predict(test_texts, verbose=0).argmax(-1)
    assert np.mean(predictions == test_labels) >= 0.9
    _, accuracy = classifier.evaluate(test_texts, test_labels, verbose=0)
    assert accuracy >= 0.9


@pytest.mark.slow
def test_masked_lm_fit_lowers_the_loss():
    keras.utils.set_random_seed(0)
    mlm = tiny_task(
        azk.models.BertMaskedLM,
        lambda tokenizer, sequence_length: azk.models.BertMaskedLMPreprocessor(
            tokenizer, sequence_length=sequence_length, mask_selection_length=4, seed=0
        ),
    )
    mlm.compile(optimizer=keras.optimizers.Adam(2e-3))
    texts = ["the cat sat on the mat", "the dog sat on the mat", "a man is eating food"] * 32
    history = mlm.fit(texts, batch_size=16, epochs=6, verbose=0)
    losses = history.history["loss"]
    assert losses[-1] < 0.7 * losses[0], losses


def test_default_compile_is_applied_by_fit():
    classifier = tiny_task(azk.models.BertTextClassifier, azk.models.BertPreprocessor, num_classes=2)
    run_task_test(classifier, ["good film", "bad film"], np.array([1, 0]), expected_output_shape=(2, 2))
    assert isinstance(classifier.optimizer, keras.optimizers.AdamW)
    assert isinstance(classifier.loss, azk.losses.ClassCrossentropy)


def test_masking_is_80_10_10_on_non_special_tokens():
    tokenizer = azk.models.BertTokenizer.from_vocabulary(TINY_VOCABULARY)
    preprocessor = azk.models.BertMaskedLMPreprocessor(
        tokenizer, sequence_length=32, mask_selection_rate=0.5, mask_selection_length=16, seed=0
    )
    text = "the film was very good but the plot was long and the acting poor"
    original = preprocessor.pack([text] * 2000)["token_ids"]
    features, labels, weights = preprocessor([text] * 2000)
    selected = weights > 0
    rows = np.nonzero(selected)[0]
    positions = features["mask_positions"][selected]
    assert np.all(labels[selected] == original[rows, positions])
    assert not np.any(np.isin(labels[selected], tokenizer.special_token_ids))
    new_tokens = features["token_ids"][rows, positions]
    masked = np.mean(new_tokens == tokenizer.mask_token_id)
    kept = np.mean(new_tokens == labels[selected])
    randomized = 1 - masked - kept
    # 0.1 random tokens; a random token equal to the original (≈1/100) counts as kept.
    assert abs(masked - 0.8) < 0.01 and abs(randomized - 0.1) < 0.01 and abs(kept - 0.1) < 0.015
    # Positions that were not selected are untouched.
    untouched = features["token_ids"].copy()
    untouched[rows, positions] = original[rows, positions]
    np.testing.assert_array_equal(untouched, original)
    # 50 % of the 14 words are selected in every row.
    np.testing.assert_array_equal(selected.sum(-1), 7)


def test_fit_takes_raw_validation_data():
    classifier = tiny_task(azk.models.BertTextClassifier, azk.models.BertPreprocessor, num_classes=2)
    texts, labels = sentiment_data(16, seed=2)
    history = classifier.fit(texts, labels, validation_data=(texts[:8], labels[:8]), batch_size=8, epochs=1, verbose=0)
    assert "val_loss" in history.history and "val_accuracy" in history.history
