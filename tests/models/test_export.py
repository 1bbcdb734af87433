"""Export for serving (issues 21, 25) with Keras' own exporter, `model.export`:
each family's task, exported with an input signature of fixed shapes,
reloads outside Keras and gives the Keras model's outputs: a TensorFlow
SavedModel from JAX and TensorFlow (`tf.saved_model.load`), ONNX from torch
(`onnxruntime`), LiteRT from TensorFlow (the LiteRT interpreter; from torch
see test_litert_torch_export.py). From
TensorFlow, a Reformer exported with its length unknown serves every
length."""

import keras
import numpy as np
import pytest

from tests.support.tiny_models import outputs_of
from tests.support.tiny_models import task_cases

BACKEND = keras.backend.backend()
FORMAT = "onnx" if BACKEND == "torch" else "tf_saved_model"


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
    keras.utils.set_random_seed(0)
    model, x = task_cases()[case]()
    expected = outputs_of(model, x)
    path = tmp_path / ("model.onnx" if FORMAT == "onnx" else "saved_model")

    model.export(str(path), format=FORMAT, input_signature=_signature(x), verbose=False)

    actual = _reloaded_outputs(path, x)
    assert len(actual) == len(expected)
    for got, wanted in zip(actual, expected):
        np.testing.assert_allclose(got, wanted, atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(
    BACKEND != "tensorflow",
    reason="an unknown length exports from TensorFlow only: JAX's shape-polymorphic export cannot compare the "
    "symbolic length in Python, and Keras sends torch's dynamic axes to the TorchScript ONNX exporter, which "
    "needs static sizes",
)
def test_a_reformer_exported_with_an_unknown_length_serves_every_length(tmp_path):
    """The Reformer pads to its chunk lengths inside the graph: one
    SavedModel serves a length its LSH layer attends to whole (3), one it
    pads (5 to 8) and one it hashes as it is (8), as the Keras model does."""
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    model, x = task_cases()["reformer_classifier"]()
    signature = [{name: keras.InputSpec(shape=(None, None), dtype="int32") for name in x}]
    model.export(str(tmp_path), format="tf_saved_model", input_signature=signature, verbose=False)

    reloaded = tf.saved_model.load(str(tmp_path))
    for length in (3, 5, 8):
        features = {name: value[:, :length] for name, value in x.items()}
        (expected,) = outputs_of(model, features)
        np.testing.assert_allclose(reloaded.serve(features).numpy(), expected, atol=1e-5, rtol=1e-5)


# The Reformer's converted graph holds a TensorFlow op LiteRT's built-in
# kernels lack (`FlexBitwiseAnd`, as `tf.lite.experimental.Analyzer` names
# it), which only an interpreter with TensorFlow's Select ops runs.
LITERT_CASES = sorted(name for name in task_cases() if not name.startswith("reformer"))


@pytest.mark.skipif(
    BACKEND != "tensorflow",
    reason="Keras exports LiteRT from TensorFlow, and from torch through litert-torch (test_litert_torch_export.py, "
    "in an environment of its own); JAX has no LiteRT export in Keras",
)
@pytest.mark.parametrize("case", LITERT_CASES)
def test_a_litert_model_gives_the_keras_outputs(case, tmp_path):
    """`model.export(path, format="litert")`: the flatbuffer, run by the
    LiteRT interpreter, gives the Keras model's outputs (its inputs are
    the dict's values in sorted key order)."""
    import warnings

    import tensorflow as tf

    keras.utils.set_random_seed(0)
    model, x = task_cases()[case]()
    expected = outputs_of(model, x)
    path = tmp_path / "model.tflite"
    model.export(str(path), format="litert", input_signature=_signature(x), verbose=False)

    with warnings.catch_warnings():  # tf.lite.Interpreter's notice that it moves to ai_edge_litert
        warnings.simplefilter("ignore", UserWarning)
        runner = tf.lite.Interpreter(model_path=str(path)).get_signature_runner()
    outputs = runner(**dict(zip(runner.get_input_details(), [x[key] for key in sorted(x)])))
    actual = [outputs[name] for name in sorted(outputs)]
    assert len(actual) == len(expected)
    for got, wanted in zip(actual, expected):
        np.testing.assert_allclose(got, wanted, atol=1e-5, rtol=1e-5)
