"""GPT's one-token decoding step exported for serving (issue 25):
`lm.decoding_step_model()` exported by Keras (LiteRT and a SavedModel from
TensorFlow, a SavedModel from JAX, ONNX from torch) and run outside Keras
token by token, the cache carried from call to call: at every position its
logits equal the Keras model's full forward pass over the tokens so far
(1e-4), and its greedy choices are `generate`'s tokens. In Keras, the step
serves softmax and linear attention alike."""

import keras
import numpy as np
import pytest

from tests.support.decoding_steps import MAX_LENGTH
from tests.support.decoding_steps import decode_with_step
from tests.support.decoding_steps import generated_tokens
from tests.support.decoding_steps import step_lm

BACKEND = keras.backend.backend()
FORMATS = {"tensorflow": ["litert", "tf_saved_model"], "jax": ["tf_saved_model"], "torch": ["onnx"]}[BACKEND]


def _runner(step, path, export_format):
    """A function `{name: array} -> {name: array}` running the exported
    file outside Keras."""
    if export_format == "onnx":
        import onnxruntime

        session = onnxruntime.InferenceSession(str(path))
        input_names = [node.name for node in session.get_inputs()]  # the inputs in Keras' flat order (sorted keys)
        output_names = ["logits", *step.empty_cache()]  # the order `call` returns them in

        def run_onnx(inputs):
            outputs = session.run(None, dict(zip(input_names, [inputs[key] for key in sorted(inputs)])))
            return dict(zip(output_names, outputs))

        return run_onnx
    import tensorflow as tf

    if export_format == "tf_saved_model":
        reloaded = tf.saved_model.load(str(path))  # (held: `serve` reads its variables)
        return lambda inputs: {
            k: np.asarray(v) for k, v in reloaded.serve({k: tf.constant(v) for k, v in inputs.items()}).items()
        }
    import warnings

    with warnings.catch_warnings():  # tf.lite.Interpreter's notice that it moves to ai_edge_litert
        warnings.simplefilter("ignore", UserWarning)
        runner = tf.lite.Interpreter(model_path=str(path)).get_signature_runner()
    input_names = list(runner.get_input_details())  # the inputs in Keras' flat order (sorted keys)

    return lambda inputs: runner(**dict(zip(input_names, [inputs[key] for key in sorted(inputs)])))  # named outputs


@pytest.mark.parametrize("export_format", FORMATS)
def test_an_exported_decoding_step_generates_what_generate_does(export_format, tmp_path):
    lm = step_lm()
    step = lm.decoding_step_model(batch_size=1, max_length=MAX_LENGTH)
    path = tmp_path / {"litert": "step.tflite", "onnx": "step.onnx", "tf_saved_model": "step"}[export_format]
    step.export(str(path), format=export_format, verbose=False)
    assert decode_with_step(_runner(step, path, export_format), step.empty_cache(), lm) == generated_tokens(lm)


@pytest.mark.parametrize("attention", ["softmax", "linear"])
def test_the_decoding_step_in_keras_serves_every_decoding_mechanism(attention):
    lm = step_lm(attention=attention, attention_dropout=0.0)
    step = lm.decoding_step_model(batch_size=1, max_length=MAX_LENGTH)

    def run(inputs):
        return {name: keras.ops.convert_to_numpy(value) for name, value in step(inputs).items()}

    assert decode_with_step(run, step.empty_cache(), lm) == generated_tokens(lm)


def test_a_cache_longer_than_the_model_is_refused():
    lm = step_lm()
    with pytest.raises(ValueError, match="longer than the model's limit"):
        lm.decoding_step_model(max_length=lm.max_generation_length + 1)
