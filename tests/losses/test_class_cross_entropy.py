"""The classifiers' default loss and metric take class indices or rows of
class probabilities: the loss equals PyTorch's `cross_entropy` (which takes
both) and the accuracy counts the argmax, and every classifier trains on
one-hot labels as on their indices."""

import keras
import numpy as np
import pytest
import torch

from attention_zoo_keras.losses import ClassCrossentropy
from attention_zoo_keras.metrics import ClassAccuracy
from tests.support.tiny_models import task_cases

rng = np.random.default_rng(0)
LOGITS = (3.0 * rng.standard_normal((6, 4))).astype("float32")
INDICES = np.array([0, 3, 1, 1, 2, 0])


def torch_cross_entropy(logits, target):
    return float(torch.nn.functional.cross_entropy(torch.tensor(logits), torch.tensor(target)))


@pytest.mark.parametrize("labels", [INDICES, INDICES[:, None]], ids=["indices", "indices_column"])
def test_indices_give_torch_cross_entropy(labels):
    loss = float(keras.ops.convert_to_numpy(ClassCrossentropy()(labels, LOGITS)))
    assert loss == pytest.approx(torch_cross_entropy(LOGITS, INDICES), abs=1e-5)


def test_probability_rows_give_torch_cross_entropy():
    one_hot = np.eye(4, dtype="float32")[INDICES]
    soft = rng.dirichlet(np.ones(4), size=6).astype("float32")
    for rows in (one_hot, soft):
        loss = float(keras.ops.convert_to_numpy(ClassCrossentropy()(rows, LOGITS)))
        assert loss == pytest.approx(torch_cross_entropy(LOGITS, rows), abs=1e-5)


def test_accuracy_counts_the_argmax_for_indices_and_rows():
    predicted = LOGITS.argmax(-1)
    expected = float(np.mean(predicted == INDICES))
    assert 0 < expected < 1
    for labels in (INDICES, np.eye(4, dtype="float32")[INDICES]):
        metric = ClassAccuracy()
        metric.update_state(labels, LOGITS)
        assert float(metric.result()) == pytest.approx(expected)


def test_the_loss_and_metric_round_trip_through_keras_serialization():
    for item in (ClassCrossentropy(), ClassAccuracy()):
        restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(item))
        assert type(restored) is type(item) and restored.get_config() == item.get_config()


@pytest.mark.parametrize("case", ["bert_classifier", "vit_classifier", "reformer_classifier"])
def test_a_classifier_trains_on_one_hot_labels_as_on_indices(case):
    """The same first step (loss and accuracy) and the same weights after it."""
    labels = np.array([0, 1, 1, 0, 1, 0, 0, 1]) % 2
    results = []
    for targets in (labels, np.eye(2 if case == "reformer_classifier" else 3, dtype="float32")[labels]):
        keras.utils.set_random_seed(0)
        model, x = task_cases()[case]()
        model.compile(**{**model.default_compile_arguments(), "optimizer": keras.optimizers.SGD(0.1)})
        logs = model.train_on_batch(x, targets, return_dict=True)
        results.append((logs, [keras.ops.convert_to_numpy(weight) for weight in model.trainable_weights]))
    (index_logs, index_weights), (row_logs, row_weights) = results
    assert row_logs["loss"] == pytest.approx(index_logs["loss"], abs=1e-5)
    assert row_logs["accuracy"] == pytest.approx(index_logs["accuracy"])
    for index_weight, row_weight in zip(index_weights, row_weights):
        np.testing.assert_allclose(row_weight, index_weight, atol=1e-6)
