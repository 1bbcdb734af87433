"""The checks every model family's tests repeat — config round trip, output
shapes and dtypes, variable input sizes, saving to `.keras` and to a preset
with equal outputs, dtype policies, a task's predict and fit on raw inputs —
as plain functions for pytest, in the manner of KerasHub's
`TestCase.run_backbone_test` / `run_task_test` / `run_preset_test`.

Outputs are compared through `outputs`: `model -> nested outputs`, by default
`model(input_data, training=False)`; a tolerance of 0 asks for equality."""

import json
from pathlib import Path

import keras
import numpy as np


def _numpy(structure):
    return keras.tree.map_structure(lambda value: np.asarray(keras.ops.convert_to_numpy(value)), structure)


def _is_float(value):
    return "float" in keras.backend.standardize_dtype(value.dtype)


def _dtypes(variables):
    return [keras.backend.standardize_dtype(variable.dtype) for variable in variables]


def _float_dtypes(output):
    return {keras.backend.standardize_dtype(value.dtype) for value in keras.tree.flatten(output) if _is_float(value)}


def _calls_on(input_data, outputs):
    return outputs or (lambda model: model(input_data, training=False))


def assert_outputs_close(actual, expected, atol, what, rtol=1e-7):
    """Asserts two output structures are equal (`atol` 0) or close.

    Args:
        actual: nested tensors. The outputs under test.
        expected: nested tensors. The reference outputs, of the same structure.
        atol: float. The absolute tolerance; 0 asks for equality.
        what: str. What is compared, for the failure message.
        rtol: float. The relative tolerance, where `atol` is not 0.
    """
    actual, expected = _numpy(actual), _numpy(expected)
    keras.tree.assert_same_structure(actual, expected)
    for ours, theirs in zip(keras.tree.flatten(actual), keras.tree.flatten(expected)):
        if atol == 0:
            np.testing.assert_array_equal(ours, theirs, err_msg=what)
        else:
            np.testing.assert_allclose(ours, theirs, atol=atol, rtol=rtol, err_msg=what)


def assert_output_shapes(output, expected_output_shape):
    """Asserts the shapes of `output`.

    Args:
        output: a tensor or a dict of tensors. The model's output.
        expected_output_shape: tuple | dict. The shape, or `{key: shape}` for
            the keys to check of a dict output.
    """
    if isinstance(expected_output_shape, dict):
        shapes = {key: tuple(output[key].shape) for key in expected_output_shape}
        assert shapes == {key: tuple(shape) for key, shape in expected_output_shape.items()}, shapes
    else:
        assert tuple(output.shape) == tuple(expected_output_shape), output.shape


def run_config_round_trip_test(model, input_data, *, outputs=None, atol=1e-6):
    """`from_config` of `get_config()` through JSON rebuilds the same model:
    the same config, weights of the same shapes, and, given the
    original's weights, the same outputs.

    Args:
        model: keras.Model. A built model of the family.
        input_data: nested arrays. Inputs for `outputs`.
        outputs: callable | None. `model -> nested outputs` to compare.
        atol: float. The tolerance on the outputs.

    Returns:
        The rebuilt model.
    """
    config = model.get_config()
    rebuilt = type(model).from_config(json.loads(json.dumps(config)))
    assert rebuilt.get_config() == config
    assert [tuple(v.shape) for v in rebuilt.weights] == [tuple(v.shape) for v in model.weights]
    rebuilt.set_weights(model.get_weights())
    outputs = _calls_on(input_data, outputs)
    assert_outputs_close(outputs(rebuilt), outputs(model), atol, "outputs after from_config(get_config())")
    return rebuilt


def run_saving_test(model, input_data, directory, *, outputs=None, atol=0.0):
    """`model.save` to a `.keras` file and `keras.saving.load_model` give
    back the same class with the same outputs.

    Args:
        model: keras.Model. The model to save.
        input_data: nested arrays. Inputs for `outputs`.
        directory: path-like. An existing directory to write `model.keras` in.
        outputs: callable | None. `model -> nested outputs` to compare.
        atol: float. The tolerance on the outputs; 0 asks for equality.

    Returns:
        The loaded model.
    """
    path = Path(directory) / "model.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert type(loaded) is type(model)
    outputs = _calls_on(input_data, outputs)
    assert_outputs_close(outputs(loaded), outputs(model), atol, "outputs after saving to .keras")
    return loaded


def run_precision_test(cls, init_kwargs, input_data, policy="mixed_bfloat16"):
    """Under `policy`, float weights take its variable dtype and float
    outputs its compute dtype.

    Args:
        cls: type. The backbone class.
        init_kwargs: dict. Its constructor arguments (without `dtype`).
        input_data: nested arrays. Its inputs.
        policy: str. The dtype policy's name.

    Returns:
        The outputs under `policy`.
    """
    policy = keras.dtype_policies.get(policy)
    model = cls(**init_kwargs, dtype=policy)
    assert set(_dtypes(v for v in model.weights if _is_float(v))) == {policy.variable_dtype}
    output = model(input_data, training=False)
    assert _float_dtypes(output) == {policy.compute_dtype}, (policy.name, _float_dtypes(output))
    return output


def run_backbone_test(
    cls, init_kwargs, input_data, expected_output_shape, directory, *, variable_input_data=(),
    run_precision_check=True,
):
    """A backbone's common behaviour: the config round trip, output shapes
    and outputs in its compute dtype, other input sizes, the compiled
    `predict` equal to the eager call, `.keras` saving and mixed precision.

    Args:
        cls: type. The backbone class.
        init_kwargs: dict. Constructor arguments of a tiny backbone.
        input_data: dict. A batch of inputs.
        expected_output_shape: tuple | dict. See `assert_output_shapes`.
        directory: path-like. An existing directory to save in.
        variable_input_data: sequence. `(inputs, expected_output_shape)`
            pairs of other batch or sequence sizes.
        run_precision_check: bool. Whether to run `run_precision_test`.

    Returns:
        The backbone.
    """
    backbone = cls(**init_kwargs)
    run_config_round_trip_test(backbone, input_data)
    output = backbone(input_data, training=False)
    assert_output_shapes(output, expected_output_shape)
    assert _float_dtypes(output) == {backbone.compute_dtype}, _float_dtypes(output)
    for inputs, shape in variable_input_data:
        assert_output_shapes(backbone(inputs, training=False), shape)
    predicted = backbone.predict(input_data, batch_size=len(keras.tree.flatten(input_data)[0]), verbose=0)
    assert_outputs_close(predicted, output, 1e-5, "predict against the eager call")
    run_saving_test(backbone, input_data, directory)
    if run_precision_check:
        run_precision_test(cls, init_kwargs, input_data)
    return backbone


def run_task_test(task, x, y=None, *, expected_output_shape, batch_size=2):
    """A task's common behaviour: `predict` on raw inputs has the expected
    shape and equals `predict` on the preprocessor's features, and `fit`
    (compiling with the task's defaults) gives a finite loss and changes the
    trainable weights.

    Args:
        task: Task. A tiny task, with a preprocessor for raw `x`.
        x: raw inputs (texts, images, ...), or features without a preprocessor.
        y: array | None. Labels, unless the preprocessor makes them.
        expected_output_shape: tuple | dict. See `assert_output_shapes`.
        batch_size: int. The batch size of `predict` and `fit`.

    Returns:
        The task's `predict` output before `fit`.
    """
    predicted = task.predict(x, batch_size=batch_size, verbose=0)
    assert_output_shapes(predicted, expected_output_shape)
    if task.preprocessor is not None:
        features, _, _ = keras.utils.unpack_x_y_sample_weight(task.preprocessor(x))
        from_features = task.predict(features, batch_size=batch_size, verbose=0)
        assert_outputs_close(from_features, predicted, 1e-5, "predict on features against raw inputs")
    before = [keras.ops.convert_to_numpy(v) for v in task.trainable_weights]
    history = task.fit(x, y, batch_size=batch_size, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"]).all(), history.history
    after = [keras.ops.convert_to_numpy(v) for v in task.trainable_weights]
    assert any(not np.array_equal(old, new) for old, new in zip(before, after)), "fit changed no weight"
    return predicted


def run_preset_test(
    model, directory, input_data, *, outputs=None, atol=0.0, rtol=1e-7, load_kwargs=None, save_kwargs=None,
    expected_files=None,
):
    """`save_to_preset` and `from_preset` of the same class give back the
    same config, weights of the same dtypes and values, and the same outputs.

    Args:
        model: Backbone | Task. The model to save.
        directory: str | Path. The preset directory to write, and the handle to load.
        input_data: nested arrays or raw inputs. Inputs for `outputs`.
        outputs: callable | None. `model -> nested outputs` to compare.
        atol: float. The tolerance on the outputs; 0 asks for equality.
        rtol: float. The relative tolerance, where `atol` is not 0.
        load_kwargs: dict | None. Arguments of `from_preset`.
        save_kwargs: dict | None. Arguments of `save_to_preset`.
        expected_files: list | None. The sorted file names the preset must hold.

    Returns:
        The reloaded model.
    """
    model.save_to_preset(directory, **(save_kwargs or {}))
    if expected_files is not None:
        assert sorted(path.name for path in Path(directory).iterdir()) == expected_files
    reloaded = type(model).from_preset(directory, **(load_kwargs or {}))
    assert type(reloaded) is type(model)
    backbone, reloaded_backbone = getattr(model, "backbone", model), getattr(reloaded, "backbone", reloaded)
    assert reloaded_backbone.get_config() == backbone.get_config()
    assert [v.path for v in reloaded.weights] == [v.path for v in model.weights]
    assert _dtypes(reloaded.weights) == _dtypes(model.weights)
    for ours, theirs in zip(reloaded.weights, model.weights):
        np.testing.assert_array_equal(
            keras.ops.convert_to_numpy(keras.ops.cast(ours, "float32")),
            keras.ops.convert_to_numpy(keras.ops.cast(theirs, "float32")),
            err_msg=ours.path,
        )
    outputs = _calls_on(input_data, outputs)
    assert_outputs_close(outputs(reloaded), outputs(model), atol, "outputs after a preset round trip", rtol)
    return reloaded
