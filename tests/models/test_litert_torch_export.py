"""LiteRT export from torch: `model.export(path, format="litert")` on the
torch backend converts through the `litert-torch` package (the `litert`
extra; these tests skip without it). Each family's task, exported
with an input signature of fixed shapes, run by the LiteRT interpreter
(`ai_edge_litert`, which `litert-torch` installs), gives the Keras model's
outputs, as tests/models/test_export.py checks for LiteRT from TensorFlow.
The cases export one after another in one process, which Keras alone fails
at from the second on (`backend_support.litert_export_settings`).

`scripts/test.sh` runs this file in its own environment
(`scripts/setup_litert_env.sh`): `litert-torch` pins `typing-extensions`
below what the notebook tests' Jupyter packages need."""

import importlib.util
import re

import keras
import numpy as np
import pytest

from tests.support.decoding_steps import MAX_LENGTH
from tests.support.decoding_steps import decode_with_step
from tests.support.decoding_steps import generated_tokens
from tests.support.decoding_steps import step_lm
from tests.support.tiny_models import outputs_of
from tests.support.tiny_models import task_cases

pytestmark = [
    pytest.mark.skipif(
        keras.backend.backend() != "torch",
        reason="Keras converts to LiteRT through litert-torch on the torch backend only",
    ),
    pytest.mark.skipif(
        importlib.util.find_spec("litert_torch") is None,
        reason="the litert-torch package is not installed (scripts/setup_litert_env.sh installs it)",
    ),
]

# The Reformer does not convert with litert-torch 0.10: the tiny one's LSH
# hashing (two buckets a factor, so an argmax over an axis of length 1) fails
# with "failed to legalize operation 'mhlo.reduce' that was explicitly marked
# illegal", and with more buckets its sort by bucket fails with "comparator
# block argument #2 should be of type 'tensor<i32>' but got 'tensor<i64>'".
# From TensorFlow it needs the Select op `FlexBitwiseAnd` (test_export.py).
CASES = sorted(name for name in task_cases() if not name.startswith("reformer"))


def _flat_position(name):
    numbered = re.fullmatch(r"output_(\d+)", name)
    return (int(numbered[1]), "") if numbered else (0, name)


@pytest.mark.parametrize("case", CASES)
def test_a_litert_model_exported_from_torch_gives_the_keras_outputs(case, tmp_path):
    """The flatbuffer's signature names its inputs `args_0_<key>`, and its
    outputs by their keys where the model returns a dict (Transformer-XL's
    backbone: sorted, as `keras.tree.flatten` orders them), else `output_<i>`
    in Keras' flat order."""
    from ai_edge_litert.interpreter import Interpreter

    keras.utils.set_random_seed(0)
    model, x = task_cases()[case]()
    expected = outputs_of(model, x)
    path = tmp_path / "model.tflite"
    signature = [{name: keras.InputSpec(shape=value.shape, dtype=str(value.dtype)) for name, value in x.items()}]
    model.export(str(path), format="litert", input_signature=signature, verbose=False)

    runner = Interpreter(model_path=str(path)).get_signature_runner()
    inputs = runner.get_input_details()
    assert sorted(inputs) == [f"args_0_{key}" for key in sorted(x)]
    outputs = runner(**{f"args_0_{key}": x[key] for key in x})
    actual = [outputs[name] for name in sorted(outputs, key=_flat_position)]
    assert len(actual) == len(expected)
    for got, wanted in zip(actual, expected):
        np.testing.assert_allclose(got, wanted, atol=1e-5, rtol=1e-5)


def test_gpts_decoding_step_exported_from_torch_generates_what_generate_does(tmp_path):
    """`lm.decoding_step_model()` as a LiteRT file from torch (inputs and
    outputs named by their keys), run token by token with its cache
    carried: each step's logits equal a full pass, its greedy tokens are
    `generate`'s."""
    from ai_edge_litert.interpreter import Interpreter

    lm = step_lm()
    step = lm.decoding_step_model(batch_size=1, max_length=MAX_LENGTH)
    path = tmp_path / "step.tflite"
    step.export(str(path), format="litert", verbose=False)

    runner = Interpreter(model_path=str(path)).get_signature_runner()
    assert sorted(runner.get_input_details()) == sorted(f"args_0_{name}" for name in step.input_signature()[0])

    def run(inputs):
        return runner(**{f"args_0_{name}": value for name, value in inputs.items()})

    assert decode_with_step(run, step.empty_cache(), lm) == generated_tokens(lm)
