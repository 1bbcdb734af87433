"""Data parallelism on TensorFlow (issue 21). Keras 3.15's
`keras.distribution` is JAX's: its TensorFlow counterpart is a prototype
(`keras/src/backend/tensorflow/distribution_lib.py` opens with "DO NOT USE"
and its `distribute_value` is a to-do), and torch has none. Keras 3 trains on
TensorFlow's own data-parallel engine instead, `tf.distribute`: each
family's task built in a `MirroredStrategy` over two CPU devices (the
logical devices `tests/conftest.py` makes) predicts what it predicts on one
device and takes the same SGD step, each replica on half of the batch.

Dropout is switched off in both runs: each replica draws its own masks for
its half of the batch, so with dropout the two runs compute different
(equally valid) steps."""

import keras
import numpy as np
import pytest

from tests.support.tiny_models import task_cases
from tests.support.tiny_models import weights_of

if keras.backend.backend() != "tensorflow":
    pytestmark = pytest.mark.skip(reason="tf.distribute is TensorFlow's (the JAX counterpart: test_distribution.py)")
else:
    import tensorflow as tf

    REPLICAS = ["/cpu:0", "/cpu:1"]
    pytestmark = pytest.mark.skipif(
        len(tf.config.list_logical_devices("CPU")) < len(REPLICAS),
        reason="needs two logical CPU devices, which tests/conftest.py makes before TensorFlow starts",
    )


@pytest.fixture(autouse=True)
def no_dropout(monkeypatch):
    monkeypatch.setattr(keras.random, "dropout", lambda inputs, *args, **kwargs: inputs)
    monkeypatch.setattr(keras.layers.Dropout, "call", lambda self, inputs, training=False: inputs)


@pytest.fixture(scope="module")
def strategy():
    """One strategy for all the tests: strategies made one after another in
    a process collide in TensorFlow's collective-op keys."""
    return tf.distribute.MirroredStrategy(REPLICAS)


def _run(case, weights=None):
    """The case's outputs (`predict`) and its weights after one SGD step
    (`fit` on one batch) towards zeros, from `weights` where given."""
    keras.utils.set_random_seed(0)
    model, x = task_cases()[case]()
    for variable in model.weights if weights else ():
        variable.assign(weights[variable.path])
    start = weights_of(model)
    batch = len(keras.tree.flatten(x)[0])
    predicted = model.predict(x, batch_size=batch, verbose=0)
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss="mse", metrics=[], weighted_metrics=[])
    model.fit(x, keras.tree.map_structure(np.zeros_like, predicted), batch_size=batch, shuffle=False, verbose=0)
    return model, start, [np.asarray(y) for y in keras.tree.flatten(predicted)], weights_of(model)


@pytest.mark.parametrize("case", sorted(task_cases()))
def test_a_mirrored_task_computes_and_trains_as_on_one_device(case, strategy):
    _, start, outputs, trained = _run(case)
    assert any(not np.array_equal(start[key], trained[key]) for key in start)  # the step moves them

    with strategy.scope():
        model, _, mirrored_outputs, mirrored_trained = _run(case, weights=start)

    assert isinstance(model.weights[0].value, tf.distribute.DistributedValues)
    for actual, wanted in zip(mirrored_outputs, outputs, strict=True):
        np.testing.assert_allclose(actual, wanted, atol=1e-5, rtol=1e-5)
    assert sorted(mirrored_trained) == sorted(trained)
    for key, value in mirrored_trained.items():
        # The replicas' gradients are summed in another order: an error
        # relative to how far the step moved the variable (ViLBERT's answer
        # head by up to 30).
        step = np.max(np.abs(trained[key] - start[key]), initial=0.0)
        np.testing.assert_allclose(value, trained[key], atol=1e-5 * (1 + step), rtol=1e-5, err_msg=key)
