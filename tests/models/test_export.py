"""Export for serving (issues 21, 25) with Keras' own exporter, `model.export`:
each family's task, exported with an input signature of fixed shapes,
reloads outside Keras and gives the Keras model's outputs: a TensorFlow
SavedModel from JAX and TensorFlow (`tf.saved_model.load`), ONNX from torch
(`onnxruntime`), LiteRT from TensorFlow (the LiteRT interpreter; from torch
see test_litert_torch_export.py). Exported without a signature, a
SavedModel from JAX (but the Reformer) and TensorFlow, and an ONNX file from
torch (but the Reformer and the masked LM), serve any batch and length; from
TensorFlow, a Reformer exported with its length unknown serves every
length."""

import keras
import numpy as np
import pytest

import attention_zoo_keras as azk

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


# Inputs whose length a test may shorten: every text axis (the region,
# memory and masked-position axes keep theirs).
TEXT_INPUTS = ("token_ids", "segment_ids", "padding_mask", "encoder_token_ids", "encoder_padding_mask",
               "decoder_token_ids", "decoder_padding_mask")


def _fewer_and_shorter(x, rows, cut):
    """The first `rows` examples of `x`, each text input `cut` positions shorter."""
    return {name: value[:rows, : value.shape[1] - cut] if name in TEXT_INPUTS else value[:rows]
            for name, value in x.items()}


def _serves_the_keras_outputs(model, path, feature_sets):
    """The SavedModel (ONNX file from torch) at `path` gives `model`'s
    outputs on each of `feature_sets`; ONNX inputs are found by name."""
    if FORMAT == "onnx":
        import onnxruntime

        session = onnxruntime.InferenceSession(str(path))

        def serve(x):
            return session.run(None, {node.name: x[node.name] for node in session.get_inputs()})
    else:
        import tensorflow as tf

        reloaded = tf.saved_model.load(str(path))

        def serve(x):
            return keras.tree.flatten(reloaded.serve({name: tf.constant(value) for name, value in x.items()}))

    for x in feature_sets:
        actual = serve(x)
        expected = outputs_of(model, x)
        assert len(actual) == len(expected)
        for got, wanted in zip(actual, expected):
            np.testing.assert_allclose(np.asarray(got), wanted, atol=1e-5, rtol=1e-5)


# Exported with their sizes unknown, these need fixed ones: from JAX the
# Reformer (its chunk padding compares the symbolic length); for ONNX from
# torch the Reformer and the masked LM (torch's exporter of unknown sizes has
# no `take_along_dim`).
NEED_FIXED_SIZES = {"jax": ("reformer_classifier",), "torch": ("reformer_classifier", "bert_masked_lm"),
                    "tensorflow": ()}[BACKEND]
UNKNOWN_SIZE_CASES = sorted(name for name in task_cases() if name not in NEED_FIXED_SIZES)


@pytest.mark.parametrize("case", UNKNOWN_SIZE_CASES)
def test_a_model_exported_without_a_signature_serves_any_batch_and_length(case, tmp_path):
    """From JAX the sizes that must be equal (a padding mask and its token
    ids) share one symbol, so the SavedModel serves any batch and length,
    as TensorFlow's does; from torch the ONNX file takes the model's own
    inputs, by name, of any batch and length."""
    keras.utils.set_random_seed(0)
    model, x = task_cases()[case]()
    path = tmp_path / ("model.onnx" if FORMAT == "onnx" else "saved_model")
    model.export(str(path), format=FORMAT, verbose=False)

    _serves_the_keras_outputs(model, path, [x, _fewer_and_shorter(x, rows=3, cut=2)])


@pytest.mark.parametrize("case", NEED_FIXED_SIZES)
def test_a_model_that_needs_fixed_sizes_is_told_to_give_them(case, tmp_path):
    model, _ = task_cases()[case]()
    with pytest.raises(ValueError, match=f"from {BACKEND} with its input sizes unknown failed.*input_signature"):
        model.export(str(tmp_path / "model"), format=FORMAT, verbose=False)


def test_a_retriever_exported_without_a_signature_serves_any_number_of_candidates(tmp_path):
    """The candidates axis is shared by the text and region inputs."""
    keras.utils.set_random_seed(0)
    _, x = task_cases()["vilbert_vqa"]()
    vqa, _ = task_cases()["vilbert_vqa"]()
    retriever = azk.models.ViLBERTImageTextRetriever(vqa.backbone)
    candidates = {name: np.stack([value[:2], value[2:4], value[4:6]], axis=1) for name, value in x.items()}
    path = tmp_path / ("model.onnx" if FORMAT == "onnx" else "saved_model")
    retriever.export(str(path), format=FORMAT, verbose=False)

    _serves_the_keras_outputs(retriever, path, [
        candidates, {name: value[:1, :2] for name, value in candidates.items()}
    ])


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
