"""BERT encoders with every mechanism of the zoo (bidirectional): padding
does not change the real tokens' outputs, the mechanism and its options
survive a preset round trip, and an encoder classifier trains."""

import keras
import numpy as np
import pytest

from attention_zoo_keras.models.bert import BertBackbone
from attention_zoo_keras.models.bert import BertTextClassifier
from tests.support.family_tests import run_preset_test

VOCABULARY = 60
MECHANISMS = [
    ("softmax", {}),
    ("linear", {}),
    ("relative", {"max_distance": 3}),
    ("local", {"block_size": 3}),
    ("sparse", {"pattern": "strided", "stride": 3}),
    ("additive", {}),
]


def backbone(attention, attention_options):
    return BertBackbone(
        vocabulary_size=VOCABULARY, num_layers=2, num_heads=2, hidden_dim=16, intermediate_dim=32,
        max_sequence_length=32, attention=attention, attention_options=attention_options,
        dropout=0.0, attention_dropout=0.0,
    )


def inputs(token_ids, padding_mask):
    token_ids = np.asarray(token_ids, "int32")
    return {"token_ids": token_ids, "segment_ids": np.zeros_like(token_ids), "padding_mask": np.asarray(padding_mask)}


@pytest.mark.parametrize("mechanism", MECHANISMS, ids=lambda m: m[0])
def test_padding_does_not_change_the_real_tokens(mechanism):
    model = backbone(*mechanism)
    ids = np.random.default_rng(0).integers(1, VOCABULARY, (1, 9))
    alone = model(inputs(ids, np.ones((1, 9), "int32")))["sequence_output"]
    padded_ids = np.concatenate([ids, np.zeros((1, 7), "int64")], axis=1)
    padded = model(inputs(padded_ids, (padded_ids > 0).astype("int32")))["sequence_output"]
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(padded)[:, :9], keras.ops.convert_to_numpy(alone), atol=1e-5
    )


@pytest.mark.parametrize("mechanism", MECHANISMS, ids=lambda m: m[0])
def test_preset_round_trip_keeps_the_mechanism(mechanism, tmp_path):
    ids = np.random.default_rng(1).integers(1, VOCABULARY, (2, 10))
    features = inputs(ids, np.ones_like(ids))
    restored = run_preset_test(
        backbone(*mechanism), tmp_path / "preset", features,
        outputs=lambda model: model(features)["sequence_output"], atol=1e-6,
    )
    assert (restored.attention, restored.attention_options) == mechanism


@pytest.mark.slow
def test_linear_attention_classifier_learns():
    """Label: whether token 1 occurs in the sequence — needs attention across positions."""
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    ids = rng.integers(2, VOCABULARY, (256, 12))
    labels = rng.integers(0, 2, 256)
    ids[labels == 1, rng.integers(0, 12, (labels == 1).sum())] = 1
    classifier = BertTextClassifier(backbone("linear", {}), num_classes=2)
    classifier.compile(optimizer=keras.optimizers.Adam(3e-3))
    features = inputs(ids, np.ones_like(ids))
    classifier.fit(features, labels, batch_size=32, epochs=12, verbose=0)
    accuracy = classifier.evaluate(features, labels, verbose=0, return_dict=True)["accuracy"]
    assert accuracy > 0.9, accuracy
