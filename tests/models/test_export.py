"""Export for serving (issue 21) with Keras' own exporter, `model.export`:
each family's task, exported with an input signature of fixed shapes (the
Reformer's chunking needs its length), reloads outside Keras and gives the
Keras model's outputs: a TensorFlow SavedModel from JAX and TensorFlow
(`tf.saved_model.load`), ONNX from torch (`onnxruntime`)."""

import keras
import numpy as np
import pytest

from tests.support.tiny_models import outputs_of
from tests.support.tiny_models import task_cases

BACKEND = keras.backend.backend()
FORMAT = "onnx" if BACKEND == "torch" else "tf_saved_model"
# What Keras' exporters cannot do with a family, and why.
UNSUPPORTED = {
    ("tensorflow", "reformer_classifier"): (
        "Keras' TensorFlow exporter also traces a `serving_default` signature from the model's own inputs, "
        "whose length is unknown, and the Reformer's chunking needs a static length"
    ),
    ("torch", "reformer_classifier"): (
        "torch.onnx's exporter fails inside its graph conversion (IndexError: 'Argument passed to at() was not "
        "in the map') on the Reformer's LSH and reversible layers"
    ),
}


def _signature(x):
    return [{name: keras.InputSpec(shape=value.shape, dtype=str(value.dtype)) for name, value in x.items()}]


def _reloaded_outputs(path, x):
    if FORMAT == "onnx":
        import onnxruntime

        session = onnxruntime.InferenceSession(str(path))
        names = [node.name for node in session.get_inputs()]
        return session.run(None, dict(zip(names, [x[key] for key in sorted(x)])))  # inputs in Keras' flat order
    import tensorflow as tf

    reloaded = tf.saved_model.load(str(path))
    return [np.asarray(output) for output in keras.tree.flatten(reloaded.serve({k: tf.constant(v) for k, v in x.items()}))]


@pytest.mark.parametrize("case", sorted(task_cases()))
def test_an_exported_model_gives_the_keras_outputs(case, tmp_path):
    if (BACKEND, case) in UNSUPPORTED:
        pytest.skip(UNSUPPORTED[(BACKEND, case)])
    keras.utils.set_random_seed(0)
    model, x = task_cases()[case]()
    expected = outputs_of(model, x)
    path = tmp_path / ("model.onnx" if FORMAT == "onnx" else "saved_model")

    model.export(str(path), format=FORMAT, input_signature=_signature(x), verbose=False)

    actual = _reloaded_outputs(path, x)
    assert len(actual) == len(expected)
    for got, wanted in zip(actual, expected):
        np.testing.assert_allclose(got, wanted, atol=1e-5, rtol=1e-5)
