"""`train_on_batch` with the trainer state's variable lists kept between
steps (`backend_support.JaxTrainerState`, on JAX): each step leaves every
variable holding the value Keras' own trainer gives it, and the lists
follow the model when its variables change (those two tests hold on every
backend)."""

import keras
import numpy as np
import pytest

import attention_zoo_keras as azk
from attention_zoo_keras.backend_support import JaxTrainerState
from tests.support.tiny_models import task_cases
from tests.support.tiny_models import text_features
from tests.support.tiny_models import tiny_bert
from tests.support.tiny_models import weights_of
from tests.support.tiny_models import zero_targets


def _classifier():
    """A tiny BERT classifier without dropout (so that two runs of the same
    steps draw nothing different), its inputs and labels."""
    model = azk.models.BertTextClassifier(tiny_bert(2, dropout=0.0, attention_dropout=0.0), num_classes=3, dropout=0.0)
    return model, text_features(8, 12), np.array([0, 1, 2, 0, 1, 2, 0, 1])


def _weights(model):
    """`{path: a copy of the value}` of every weight (on JAX a numpy view
    of a variable's buffer would follow it once a step donates it)."""
    return {path: np.array(value, copy=True) for path, value in weights_of(model).items()}


def _compiled(model):
    """`model` compiled with Adam and the cross-entropy of its logits (the
    cross-entropy of probabilities would clip logits outside (0, 1), so
    that some random initial weights get no gradient at all)."""
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=loss, metrics=["accuracy"])
    return model


def _batches(x, y, size):
    for start in range(0, len(y), size):
        yield {name: value[start : start + size] for name, value in x.items()}, y[start : start + size]


def _state(model):
    """Every weight and every optimizer variable (by its path inside the
    optimizer), as numpy."""
    optimizer = {
        "optimizer/" + variable.path.split("/", 1)[1]: np.array(keras.ops.convert_to_numpy(variable), copy=True)
        for variable in model.optimizer.variables
    }
    return {**_weights(model), **optimizer}


@pytest.mark.skipif(keras.backend.backend() != "jax", reason="Keras' JAX trainer only (elsewhere the mixin is inert)")
def test_train_on_batch_leaves_the_state_that_keras_own_trainer_leaves(monkeypatch):
    """Four `train_on_batch` calls with the lists kept, and the same four
    with Keras' own `_get_jax_state`, `jax_state_sync` and attribute
    tracking, run the same compiled step from the same weights: every
    weight and every optimizer variable (Adam's moments, the step count)
    must end equal. A step whose new values were not assigned back, or
    assigned to the wrong variables, leaves them apart."""
    stepped, x, y = _classifier()
    reference, _, _ = _classifier()
    reference.set_weights([np.array(value, copy=True) for value in stepped.get_weights()])
    _compiled(stepped), _compiled(reference)
    batches = list(_batches(x, y, 2))

    initial = _weights(stepped)
    for batch_x, batch_y in batches:
        stepped.train_on_batch(batch_x, batch_y)
    with monkeypatch.context() as patch:
        for name in ("_get_jax_state", "jax_state_sync"):
            patch.setattr(JaxTrainerState, name, getattr(keras.Model, name))
        patch.delattr(JaxTrainerState, "__setattr__")
        for batch_x, batch_y in batches:
            reference.train_on_batch(batch_x, batch_y)

    assert int(keras.ops.convert_to_numpy(stepped.optimizer.iterations)) == 4
    expected, got = _state(reference), _state(stepped)
    assert got.keys() == expected.keys()
    assert sum(not np.array_equal(got[path], value) for path, value in initial.items()) > len(initial) // 2
    for path, value in expected.items():
        np.testing.assert_array_equal(got[path], value, err_msg=path)


def test_a_backbone_frozen_and_recompiled_between_steps_stays_as_it_was():
    """Keras asks for `compile()` after `trainable` changes; the steps after
    it must list the variables anew: the frozen backbone keeps its weights,
    the head still trains."""
    model, x, y = _classifier()
    _compiled(model).train_on_batch(x, y)
    model.backbone.trainable = False
    _compiled(model)
    before = _weights(model)
    for _ in range(2):
        model.train_on_batch(x, y)
    after = _weights(model)
    backbone_paths = {variable.path for variable in model.backbone.weights}
    for path in backbone_paths:
        np.testing.assert_array_equal(after[path], before[path], err_msg=path)
    head = [path for path in after if path not in backbone_paths]
    assert head and any(not np.array_equal(after[path], before[path]) for path in head)


def test_lora_enabled_between_steps_trains_the_adapters_only():
    """LoRA added after training has begun adds variables (and, as Keras
    asks, a new optimizer for them): the next steps must see them (they
    train) and leave the frozen kernels as they are."""
    model, x = task_cases()["gpt_causal_lm"]()
    y = zero_targets(model, x)

    def compiled(model):
        model.compile(optimizer=keras.optimizers.SGD(0.5), loss="mse", metrics=[], weighted_metrics=[])
        return model

    compiled(model).train_on_batch(x, y)
    model.enable_lora(2)
    compiled(model)
    before = _weights(model)
    model.train_on_batch(x, y)
    after = _weights(model)
    adapters = [path for path in after if "lora" in path]
    assert adapters and any(not np.array_equal(after[path], before[path]) for path in adapters)
    frozen = [variable.path for variable in model.non_trainable_weights if variable.path in before]
    assert frozen
    for path in frozen:
        np.testing.assert_array_equal(after[path], before[path], err_msg=path)
