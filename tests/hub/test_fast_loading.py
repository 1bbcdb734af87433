"""Loading builds the model once (issue 21): every variable a preset fills
is created holding its value, so no initializer runs for it — in this
library's format and in `transformers`' — while variables the preset lacks
(a fresh task head) still start from their initializers, and the loaded
model equals the saved one."""

import keras
import numpy as np
import pytest

import attention_zoo_keras as azk
from tests.support.tiny_models import text_features
from tests.support.tiny_models import tiny_bert


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


def _numpy(model):
    return {v.path: keras.ops.convert_to_numpy(v) for v in model.weights}


def test_a_native_preset_loads_without_running_an_initializer(tmp_path, initializer_calls):
    keras.utils.set_random_seed(0)
    backbone = tiny_bert(num_layers=2)
    backbone.save_to_preset(tmp_path)
    initializer_calls.clear()

    loaded = azk.models.BertBackbone.from_preset(tmp_path)

    assert initializer_calls == {}
    saved, restored = _numpy(backbone), _numpy(loaded)
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
        keras.ops.convert_to_numpy(keras.ops.cast(variable, "float32")), _numpy(backbone)[kernel], rtol=1e-2
    )
