"""A layer's `trainable` changed after the step functions were made
(`models.trainable_changes.FollowsTrainableChanges`), on every backend:
inference and evaluation go on giving what they gave (no `compile()`
needed), training asks for `compile()` instead of training the frozen
variables (or, on JAX, failing on lists of the wrong length), and after
`compile()` only the trainable variables train."""

import keras
import numpy as np
import pytest

import attention_zoo_keras as azk
from tests.support.tiny_models import task_cases
from tests.support.tiny_models import text_features
from tests.support.tiny_models import tiny_bert
from tests.support.tiny_models import weights_of
from tests.support.tiny_models import zero_targets

LABELS = np.array([0, 1, 2, 0, 1, 2, 0, 1])


def _compiled(model, loss=None):
    loss = loss or keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss=loss, metrics=[], weighted_metrics=[])
    return model


def _trained_classifier():
    """A tiny BERT classifier after a `fit`, `evaluate` and `predict_on_batch`
    (every step function made), its inputs, and what it predicted."""
    model = azk.models.BertTextClassifier(tiny_bert(2), num_classes=3, dropout=0.0)
    x = text_features(8, 12)
    _compiled(model).fit(x, LABELS, batch_size=4, epochs=1, verbose=0)
    model.evaluate(x, LABELS, verbose=0)
    return model, x, keras.ops.convert_to_numpy(model.predict_on_batch(x))


def _changed(before, after, paths):
    return [path for path in paths if not np.array_equal(before[path], after[path])]


def test_inference_after_freezing_needs_no_compile():
    model, x, logits = _trained_classifier()
    loss = model.evaluate(x, LABELS, verbose=0)
    model.backbone.trainable = False
    np.testing.assert_allclose(keras.ops.convert_to_numpy(model.predict_on_batch(x)), logits, atol=1e-6)
    np.testing.assert_allclose(model.predict(x, batch_size=4, verbose=0), logits, atol=1e-6)
    np.testing.assert_allclose(model.evaluate(x, LABELS, verbose=0), loss, rtol=1e-6)
    np.testing.assert_allclose(model.test_on_batch(x, LABELS), loss, rtol=1e-6)


@pytest.mark.parametrize("method", ["fit", "train_on_batch"])
def test_training_after_freezing_asks_for_compile_and_changes_nothing(method):
    model, x, _ = _trained_classifier()
    model.backbone.trainable = False
    before = weights_of(model)
    train = {"fit": lambda: model.fit(x, LABELS, epochs=1, verbose=0), "train_on_batch": lambda: model.train_on_batch(x, LABELS)}
    with pytest.raises(ValueError, match=r"trainable variables changed .*\(\d+ were trainable then, 2 are now.*compile\(\) again"):
        train[method]()
    after = weights_of(model)
    assert not _changed(before, after, before)
    # Unfrozen again, the set is the one the step was made for: training goes on.
    model.backbone.trainable = True
    model.train_on_batch(x, LABELS)
    assert _changed(after, weights_of(model), after)


def test_after_compile_only_the_trainable_variables_train():
    model, x, _ = _trained_classifier()
    model.backbone.trainable = False
    _compiled(model)
    before = weights_of(model)
    model.fit(x, LABELS, batch_size=4, epochs=1, verbose=0)
    after = weights_of(model)
    backbone = {variable.path for variable in model.backbone.weights}
    assert not _changed(before, after, backbone)
    assert _changed(before, after, set(after) - backbone)
    # Unfreezing is a change too.
    model.backbone.trainable = True
    with pytest.raises(ValueError, match=r"\(2 were trainable then, \d+ are now"):
        model.train_on_batch(x, LABELS)


def test_a_layer_frozen_before_the_first_step_is_no_change():
    """No flag flips after the step is made: every step trains the head
    alone, without asking for compile()."""
    model = azk.models.BertTextClassifier(tiny_bert(2), num_classes=3, dropout=0.0)
    model.backbone.trainable = False
    x = text_features(8, 12)
    _compiled(model)
    before = weights_of(model)
    for _ in range(2):
        model.train_on_batch(x, LABELS)
    model.fit(x, LABELS, batch_size=4, epochs=1, verbose=0)
    after = weights_of(model)
    backbone = {variable.path for variable in model.backbone.weights}
    assert not _changed(before, after, backbone) and _changed(before, after, set(after) - backbone)


@pytest.mark.parametrize("case", ["gpt_causal_lm", "vit_classifier", "seq2seq_lm"])
def test_other_tasks_predict_after_freezing_and_ask_for_compile_to_train(case):
    model, x = task_cases()[case]()
    y = zero_targets(model, x)
    _compiled(model, loss="mse").train_on_batch(x, y)
    expected = keras.tree.map_structure(keras.ops.convert_to_numpy, model.predict_on_batch(x))
    model.backbone.trainable = False
    got = keras.tree.map_structure(keras.ops.convert_to_numpy, model.predict_on_batch(x))
    keras.tree.map_structure(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), got, expected)
    with pytest.raises(ValueError, match=r"compile\(\) again"):
        model.train_on_batch(x, y)
