"""Checkpoint averaging: the mean of saved presets lands in the model, bad
checkpoints are named, and `KeepLastCheckpoints` keeps the last N during
`fit`."""

import keras
import numpy as np
import pytest

import attention_zoo_keras as azk
from attention_zoo_keras.hub.weights import variables_by_key
from attention_zoo_keras.training import KeepLastCheckpoints
from attention_zoo_keras.training import average_checkpoints

TINY = dict(
    vocabulary_size=30, num_layers=2, num_heads=2, hidden_dim=8, intermediate_dim=16, max_sequence_length=8
)


def tiny_backbone(**overrides):
    return azk.models.BertBackbone(**{**TINY, **overrides})


def weights_of(model):
    return {key: keras.ops.convert_to_numpy(variable) for key, variable in variables_by_key(model).items()}


def save_random_weights(model, directory, seed):
    """Gives every variable random values, saves the model, returns the values."""
    rng = np.random.default_rng(seed)
    for variable in model.weights:
        variable.assign(rng.standard_normal(variable.shape).astype(variable.dtype))
    model.save_to_preset(directory)
    return weights_of(model)


def features(count, seed=0):
    rng = np.random.default_rng(seed)
    token_ids = rng.integers(1, TINY["vocabulary_size"], size=(count, TINY["max_sequence_length"]))
    return {
        "token_ids": token_ids,
        "segment_ids": np.zeros_like(token_ids),
        "padding_mask": np.ones_like(token_ids),
    }


def test_averaged_weights_are_the_mean_of_the_saved_ones(tmp_path):
    model = tiny_backbone()
    saved = [save_random_weights(model, tmp_path / f"checkpoint_{i}", seed=i) for i in range(3)]
    fresh = tiny_backbone()
    average_checkpoints(fresh, [tmp_path / f"checkpoint_{i}" for i in range(3)])
    averaged = weights_of(fresh)
    assert averaged.keys() == saved[0].keys()
    for key, value in averaged.items():
        mean = np.mean([weights[key] for weights in saved], axis=0)
        np.testing.assert_allclose(value, mean, rtol=1e-6, atol=1e-6)


def test_one_checkpoint_is_loaded_as_is(tmp_path):
    saved = save_random_weights(tiny_backbone(), tmp_path / "only", seed=0)
    model = tiny_backbone()
    average_checkpoints(model, [str(tmp_path / "only")])
    for key, value in weights_of(model).items():
        np.testing.assert_array_equal(value, saved[key])


def test_mean_is_cast_to_each_variables_dtype(tmp_path):
    model = tiny_backbone(dtype="bfloat16")
    saved = [save_random_weights(model, tmp_path / f"checkpoint_{i}", seed=i) for i in range(2)]
    average_checkpoints(model, [tmp_path / "checkpoint_0", tmp_path / "checkpoint_1"])
    for key, value in weights_of(model).items():
        assert value.dtype == saved[0][key].dtype
        mean = (saved[0][key].astype("float64") + saved[1][key].astype("float64")) / 2
        np.testing.assert_array_equal(value, mean.astype(value.dtype))


def test_no_checkpoint_is_refused():
    with pytest.raises(ValueError, match="at least one checkpoint"):
        average_checkpoints(tiny_backbone(), [])


def test_a_single_path_instead_of_a_list_is_refused(tmp_path):
    with pytest.raises(TypeError, match="must be a list of presets"):
        average_checkpoints(tiny_backbone(), str(tmp_path))


def test_missing_checkpoint_directory_is_named(tmp_path):
    with pytest.raises(azk.hub.PresetFileError, match="epoch_009"):
        average_checkpoints(tiny_backbone(), [tmp_path / "epoch_009"])


def test_checkpoint_lacking_variables_is_named_and_the_model_is_unchanged(tmp_path):
    save_random_weights(tiny_backbone(), tmp_path / "two_layers", seed=0)
    save_random_weights(tiny_backbone(num_layers=1), tmp_path / "one_layer", seed=1)
    model = tiny_backbone()
    before = weights_of(model)
    message = r"Checkpoint '.*one_layer' lacks \d+ weights the model needs: transformer_layer_1/"
    with pytest.raises(ValueError, match=message):
        average_checkpoints(model, [tmp_path / "two_layers", tmp_path / "one_layer"])
    for key, value in weights_of(model).items():
        np.testing.assert_array_equal(value, before[key])


def test_shape_mismatch_names_variable_checkpoint_and_both_shapes(tmp_path):
    save_random_weights(tiny_backbone(), tmp_path / "narrow", seed=0)
    save_random_weights(tiny_backbone(intermediate_dim=32), tmp_path / "wide", seed=1)
    model = tiny_backbone()
    before = weights_of(model)
    message = r"Shape mismatch for variable '.*': the model expects \(8, 16\) but checkpoint '.*wide' has \(8, 32\)"
    with pytest.raises(ValueError, match=message):
        average_checkpoints(model, [tmp_path / "narrow", tmp_path / "wide"])
    for key, value in weights_of(model).items():
        np.testing.assert_array_equal(value, before[key])


def tiny_classifier():
    keras.utils.set_random_seed(0)
    classifier = azk.models.BertTextClassifier(backbone=tiny_backbone(dropout=0.0), num_classes=2)
    classifier.compile(optimizer=keras.optimizers.Adam(1e-2))
    return classifier


def test_callback_keeps_the_last_epochs_and_they_average_into_the_task(tmp_path):
    classifier = tiny_classifier()
    x, y = features(16), np.arange(16) % 2
    keep_last = KeepLastCheckpoints(tmp_path / "checkpoints", keep=2)
    classifier.fit(x, y, batch_size=8, epochs=4, callbacks=[keep_last], verbose=0)
    assert keep_last.paths == [tmp_path / "checkpoints" / "epoch_003", tmp_path / "checkpoints" / "epoch_004"]
    assert sorted(path.name for path in (tmp_path / "checkpoints").iterdir()) == ["epoch_003", "epoch_004"]
    final = weights_of(classifier)
    last = azk.models.BertTextClassifier.from_preset(keep_last.paths[-1], preprocessor=None)
    for key, value in weights_of(last).items():
        np.testing.assert_array_equal(value, final[key])
    saved = [
        weights_of(azk.models.BertTextClassifier.from_preset(path, preprocessor=None)) for path in keep_last.paths
    ]
    average_checkpoints(classifier, keep_last.paths)
    for key, value in weights_of(classifier).items():
        np.testing.assert_allclose(value, (saved[0][key] + saved[1][key]) / 2, rtol=1e-6, atol=1e-7)


def test_callback_saving_every_few_steps(tmp_path):
    classifier = tiny_classifier()
    keep_last = KeepLastCheckpoints(tmp_path, keep=2, save_freq=3)
    classifier.fit(features(10), np.arange(10) % 2, batch_size=2, epochs=2, callbacks=[keep_last], verbose=0)
    assert [path.name for path in keep_last.paths] == ["step_000006", "step_000009"]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["step_000006", "step_000009"]


def test_a_second_fit_does_not_list_a_checkpoint_twice(tmp_path):
    classifier = tiny_classifier()
    keep_last = KeepLastCheckpoints(tmp_path, keep=3)
    for _ in range(2):
        classifier.fit(features(8), np.arange(8) % 2, epochs=2, callbacks=[keep_last], verbose=0)
    assert [path.name for path in keep_last.paths] == ["epoch_001", "epoch_002"]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["epoch_001", "epoch_002"]


def test_callback_needs_a_model_with_save_to_preset(tmp_path):
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(TypeError, match="save_to_preset"):
        model.fit(np.ones((4, 2)), np.ones((4, 1)), callbacks=[KeepLastCheckpoints(tmp_path)], verbose=0)


@pytest.mark.parametrize(
    "arguments, message",
    [
        ({"keep": 0}, "keep must be a positive int"),
        ({"save_freq": "batch"}, "save_freq must be 'epoch' or a positive int"),
        ({"save_freq": 0}, "save_freq must be 'epoch' or a positive int"),
    ],
)
def test_callback_bad_arguments_are_named(tmp_path, arguments, message):
    with pytest.raises(ValueError, match=message):
        KeepLastCheckpoints(tmp_path, **arguments)


def test_a_model_without_variables_is_refused(tmp_path):
    save_random_weights(tiny_backbone(), tmp_path / "checkpoint", seed=0)
    unbuilt = keras.Sequential([keras.layers.Dense(2)])
    with pytest.raises(ValueError, match="has no variables to average; build it first"):
        average_checkpoints(unbuilt, [tmp_path / "checkpoint"])
