"""Loading builds the model once (issue 21): every variable a preset fills
is created holding its value, so no initializer runs for it — in this
library's format and in `transformers`' — while variables the preset lacks
(a fresh task head) still start from their initializers, and the loaded
model equals the saved one. The weights are in memory once: where the
backend allows, a variable is the checkpoint file's copy-on-write mapping."""

from pathlib import Path

import keras
import numpy as np
import pytest

import attention_zoo_keras as azk
from attention_zoo_keras.backend_support import initialized_from
from attention_zoo_keras.hub.preset_loader import get_preset_loader
from tests.support.tiny_models import text_features
from tests.support.tiny_models import tiny_bert
from tests.support.tiny_models import weights_of


@pytest.fixture
def initializer_calls(monkeypatch):
    """Counts calls of every Keras initializer class, by class name."""
    calls = {}
    classes = {cls for cls in vars(keras.initializers).values() if isinstance(cls, type)}  # less aliases
    for cls in classes:
        if issubclass(cls, keras.initializers.Initializer) and "__call__" in vars(cls):
            original = vars(cls)["__call__"]

            def counted(self, *args, _original=original, **kwargs):
                calls[type(self).__name__] = calls.get(type(self).__name__, 0) + 1
                return _original(self, *args, **kwargs)

            monkeypatch.setattr(cls, "__call__", counted)
    return calls


def test_a_native_preset_loads_without_running_an_initializer(tmp_path, initializer_calls):
    keras.utils.set_random_seed(0)
    backbone = tiny_bert(num_layers=2)
    backbone.save_to_preset(tmp_path)
    initializer_calls.clear()

    loaded = azk.models.BertBackbone.from_preset(tmp_path)

    assert initializer_calls == {}
    saved, restored = weights_of(backbone), weights_of(loaded)
    assert sorted(saved) == sorted(restored)
    for key in saved:
        np.testing.assert_array_equal(restored[key], saved[key], err_msg=key)


def test_building_without_weights_runs_every_initializer(tmp_path, initializer_calls):
    """The counter sees initializers (so the test above can fail)."""
    tiny_bert(num_layers=2).save_to_preset(tmp_path)
    initializer_calls.clear()
    backbone = azk.models.BertBackbone.from_preset(tmp_path, load_weights=False)
    assert sum(initializer_calls.values()) == len(backbone.weights)


def test_a_fresh_head_alone_is_initialized(tmp_path, initializer_calls):
    keras.utils.set_random_seed(0)
    backbone = tiny_bert()
    backbone.save_to_preset(tmp_path)
    initializer_calls.clear()

    classifier = azk.models.BertTextClassifier.from_preset(tmp_path, num_classes=3, preprocessor=None)

    backbone_keys = {v.path for v in classifier.backbone.weights}
    head = [v for v in classifier.weights if v.path not in backbone_keys]
    assert head and sum(initializer_calls.values()) == len(head)
    x = text_features(2, 8)
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(classifier.backbone(x)["sequence_output"]),
        keras.ops.convert_to_numpy(backbone(x)["sequence_output"]),
    )


def test_a_transformers_checkpoint_loads_without_running_an_initializer(tiny_bert_checkpoints, initializer_calls):
    azk.models.BertBackbone.from_preset(str(tiny_bert_checkpoints["model"]))
    assert initializer_calls == {}


def test_a_preset_in_another_dtype_is_created_in_that_dtype(tmp_path, initializer_calls):
    keras.utils.set_random_seed(0)
    backbone = tiny_bert()
    backbone.save_to_preset(tmp_path)
    initializer_calls.clear()
    loaded = azk.models.BertBackbone.from_preset(tmp_path, dtype="bfloat16")
    assert initializer_calls == {}
    kernel = "transformer_layer_0/self_attention/query/kernel"
    (variable,) = [v for v in loaded.weights if v.path == kernel]
    assert keras.backend.standardize_dtype(variable.dtype) == "bfloat16"
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(keras.ops.cast(variable, "float32")), weights_of(backbone)[kernel], rtol=1e-2
    )


# --- weights in memory once: variables on the checkpoint's own memory -----------------------------

BACKEND = keras.backend.backend()


def _mapped_ranges(path):
    """The address ranges where this process maps the file `path`."""
    ranges = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5] == str(Path(path).resolve()):
            low, high = (int(bound, 16) for bound in fields[0].split("-"))
            ranges.append((low, high))
    return ranges


def _address(variable):
    value = variable.value
    return value.data_ptr() if BACKEND == "torch" else value.unsafe_buffer_pointer()


def _in_file(variables, path):
    ranges = _mapped_ranges(path)
    return {v.path for v in variables if any(low <= _address(v) < high for low, high in ranges)}


needs_proc_maps = pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads Linux's /proc/self/maps")


@needs_proc_maps
@pytest.mark.skipif(BACKEND == "tensorflow", reason="TensorFlow copies host arrays into its own buffers")
def test_a_native_preset_s_variables_are_the_file_s_memory(tmp_path):
    """Every tensor of a model whose rows are multiples of 64 bytes starts
    aligned in a preset this library writes, so each variable is the
    checkpoint's copy-on-write mapping: nothing is copied at load."""
    keras.utils.set_random_seed(0)
    backbone = tiny_bert(hidden_dim=16, intermediate_dim=32, vocabulary_size=32)
    backbone.save_to_preset(tmp_path)

    loaded = azk.models.BertBackbone.from_preset(tmp_path)

    assert _in_file(loaded.weights, tmp_path / "model.safetensors") == {v.path for v in loaded.weights}
    x = text_features(2, 8)
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(loaded(x)["sequence_output"]), keras.ops.convert_to_numpy(backbone(x)["sequence_output"])
    )


@needs_proc_maps
@pytest.mark.skipif(BACKEND != "torch", reason="torch computes with strided (transposed) weights as they are")
def test_transposed_kernels_of_a_transformers_checkpoint_stay_views_of_the_file(tiny_bert_checkpoints):
    path = tiny_bert_checkpoints["model"]
    loaded = azk.models.BertBackbone.from_preset(str(path))
    kernels = [v for v in loaded.weights if v.path.endswith("query/kernel")]
    assert kernels and all(not v.value.is_contiguous() for v in kernels)
    assert _in_file(loaded.weights, path / "model.safetensors") == {v.path for v in loaded.weights}


def test_changing_a_loaded_model_leaves_its_preset_file_alone(tmp_path):
    """The mapping is copy-on-write: assigning (in place, on torch) changes
    the model, never the file, and a second load gets the saved weights."""
    keras.utils.set_random_seed(0)
    tiny_bert(hidden_dim=16, intermediate_dim=32, vocabulary_size=32).save_to_preset(tmp_path)
    weights_file = tmp_path / "model.safetensors"
    saved_bytes = weights_file.read_bytes()
    loaded = azk.models.BertBackbone.from_preset(tmp_path)
    saved = weights_of(loaded)

    for variable in loaded.weights:
        variable.assign(keras.ops.zeros(variable.shape, variable.dtype))

    assert weights_file.read_bytes() == saved_bytes
    assert all(not np.any(value) for value in weights_of(loaded).values())
    again = weights_of(azk.models.BertBackbone.from_preset(tmp_path))
    for key, value in saved.items():
        np.testing.assert_array_equal(again[key], value, err_msg=key)


def test_variables_filled_from_one_array_do_not_share_memory():
    """A converter may hand one array to two variables: each gets its own
    memory, so training one never changes the other."""

    class FreshArrays(dict):
        reads_fresh_arrays = True

    array = np.ones((4, 4), np.float32)
    with initialized_from(FreshArrays({"first/kernel": array, "second/kernel": array})):
        first, second = keras.layers.Dense(4, name="first"), keras.layers.Dense(4, name="second")
        first.build((None, 4))
        second.build((None, 4))

    first.kernel.assign(np.zeros((4, 4), np.float32))

    np.testing.assert_array_equal(keras.ops.convert_to_numpy(second.kernel), np.ones((4, 4)))


def test_models_built_from_one_loader_do_not_share_memory(tiny_bert_checkpoints):
    """The first model built from a `transformers` checkpoint's loader takes
    the conversion's arrays as its memory; a second one gets its own."""
    loader = get_preset_loader(str(tiny_bert_checkpoints["model"]))
    first = azk.models.BertBackbone.from_preset(loader)
    second = azk.models.BertBackbone.from_preset(loader)
    expected = weights_of(second)

    for variable in first.weights:
        variable.assign(keras.ops.zeros(variable.shape, variable.dtype))

    for key, value in weights_of(second).items():
        np.testing.assert_array_equal(value, expected[key], err_msg=key)
