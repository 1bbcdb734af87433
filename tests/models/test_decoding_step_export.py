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

import attention_zoo_keras as azk
from tests.support.decoding_steps import MAX_LENGTH
from tests.support.decoding_steps import decode_with_step
from tests.support.decoding_steps import generated_tokens
from tests.support.decoding_steps import step_lm
from tests.support.tiny_models import tiny_reformer

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


def _reformer_lm():
    keras.utils.set_random_seed(3)
    return azk.models.ReformerCausalLM(tiny_reformer(hash_seed=0))


def _transformer_xl_lm():
    keras.utils.set_random_seed(3)
    return azk.models.TransformerXLCausalLM(azk.models.TransformerXLBackbone(
        vocabulary_size=30, num_layers=1, num_heads=2, hidden_dim=8, head_dim=4, intermediate_dim=16, mem_len=4,
        cutoffs=[10, 20], div_val=2, dropout=0.0))


# The Reformer's LiteRT file needs TensorFlow's Select ops (see ServingExport.export).
OTHER_FAMILY_CASES = [(family, export_format) for family in ("reformer", "transformer_xl") for export_format in FORMATS
                      if (family, export_format) != ("reformer", "litert")]


@pytest.mark.parametrize(("family", "export_format"), OTHER_FAMILY_CASES)
def test_the_exported_decoding_steps_of_the_reformer_and_transformer_xl_generate_what_generate_does(
    family, export_format, tmp_path
):
    """LSH and local decoding caches (the Reformer) and the segment memory
    (Transformer-XL) carried by the runtime: greedy choices of the exported
    step, fed the prompt and then its own choices, are `generate`'s."""
    lm = {"reformer": _reformer_lm, "transformer_xl": _transformer_xl_lm}[family]()
    step = lm.decoding_step_model(batch_size=1, max_length=8)
    path = tmp_path / {"litert": "step.tflite", "onnx": "step.onnx", "tf_saved_model": "step"}[export_format]
    step.export(str(path), format=export_format, verbose=False)
    run = _runner(step, path, export_format)

    prompt, new_tokens = [5, 17, 3], 4
    ids, cache = list(prompt), step.empty_cache()
    for position in range(len(prompt) + new_tokens - 1):
        outputs = run({"token_ids": np.array([[ids[position]]], "int32"), "index": np.array([position], "int32"),
                       **cache})
        cache = {name: value for name, value in outputs.items() if name != "logits"}
        if position >= len(prompt) - 1:
            ids.append(int(np.argmax(outputs["logits"][0])))
    expected = lm.generate({"token_ids": [prompt]}, max_new_tokens=new_tokens, stop_token_ids=None)["token_ids"][0]
    assert ids == list(np.asarray(expected)[: len(ids)])
