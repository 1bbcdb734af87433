"""Converted ViT checkpoints against `transformers` (tolerance: 1e-4 absolute,
fp32), at the trained resolution and at others (interpolated position
embeddings), preset round trips, the head and image settings the converter
hands to tasks, and errors."""

import json
import shutil

import keras
import numpy as np
import pytest
import torch
import transformers

from attention_zoo_keras.hub.converters import converter_for
from attention_zoo_keras.hub.source import PresetSource
from attention_zoo_keras.models.task import Task
from attention_zoo_keras.models.vit import ViTBackbone
from attention_zoo_keras.models.vit import ViTImageClassifier
from tests.support.family_tests import run_backbone_test
from tests.support.family_tests import run_config_round_trip_test
from tests.support.family_tests import run_precision_test
from tests.support.family_tests import run_preset_test
from tests.support.tiny_models import weights_of
from tests.support.tiny_checkpoints import TINY_VIT
from tests.support.tiny_checkpoints import perturbed

ATOL = 1e-4


def images(height=32, width=32, batch=2, seed=0):
    """The same float images for torch (NCHW) and for us (NHWC)."""
    pixels = np.random.default_rng(seed).normal(size=(batch, 3, height, width)).astype("float32")
    return torch.from_numpy(pixels), {"images": pixels.transpose(0, 2, 3, 1)}


def numpy(outputs):
    return {key: keras.ops.convert_to_numpy(value) for key, value in outputs.items()}


def test_vit_model_sequence_and_pooled_output(tiny_vit_checkpoints):
    path = tiny_vit_checkpoints["model"]
    reference = transformers.ViTModel.from_pretrained(path).eval()
    theirs, ours = images()
    with torch.no_grad():
        expected = reference(theirs)
    backbone = ViTBackbone.from_preset(str(path))
    assert backbone.use_pooler and backbone.image_size == (32, 32) and backbone.grid_size == (4, 4)
    outputs = numpy(backbone(ours))
    assert outputs["sequence_output"].shape == (2, 17, 32)
    np.testing.assert_allclose(outputs["sequence_output"], expected.last_hidden_state.numpy(), atol=ATOL)
    np.testing.assert_allclose(outputs["pooled_output"], expected.pooler_output.numpy(), atol=ATOL)


@pytest.mark.parametrize(
    ("name", "reference_cls"),
    [
        ("no_pooler", transformers.ViTModel),
        ("classifier", transformers.ViTForImageClassification),
        ("masked_image_modeling", transformers.ViTForMaskedImageModeling),
    ],
)
def test_checkpoints_without_a_pooler(tiny_vit_checkpoints, name, reference_cls):
    """`ViTModel(add_pooling_layer=False)`, and the task models' `vit.` encoders."""
    path = tiny_vit_checkpoints[name]
    reference = reference_cls.from_pretrained(path)
    reference = reference if name == "no_pooler" else reference.vit
    theirs, ours = images(seed=1)
    with torch.no_grad():
        expected = reference.eval()(theirs).last_hidden_state.numpy()
    backbone = ViTBackbone.from_preset(str(path))
    assert not backbone.use_pooler
    outputs = numpy(backbone(ours))
    assert set(outputs) == {"sequence_output"}
    np.testing.assert_allclose(outputs["sequence_output"], expected, atol=ATOL)


@pytest.mark.parametrize("image_size", [48, (32, 48), (16, 64), 24])
def test_other_resolutions_match_interpolate_pos_encoding(tiny_vit_checkpoints, image_size):
    """(16, 64) has as many patches as the trained 32x32 (a 2x8 grid against
    4x4): the grid is still resized, as transformers does."""
    height, width = (image_size, image_size) if isinstance(image_size, int) else image_size
    path = tiny_vit_checkpoints["model"]
    reference = transformers.ViTModel.from_pretrained(path).eval()
    theirs, ours = images(height, width, seed=2)
    with torch.no_grad():
        expected = reference(theirs, interpolate_pos_encoding=True)
    backbone = ViTBackbone.from_preset(str(path), image_size=image_size)
    assert backbone.get_config()["image_size"] == (height, width)
    outputs = numpy(backbone(ours))
    np.testing.assert_allclose(outputs["sequence_output"], expected.last_hidden_state.numpy(), atol=ATOL)
    np.testing.assert_allclose(outputs["pooled_output"], expected.pooler_output.numpy(), atol=ATOL)


def _assert_restored(restored, original, x):
    """The same weights, bit for bit, and the same outputs up to float32
    rounding: on torch a kernel converted from `transformers` is a
    transposed view of the checkpoint (never copied), which a matrix
    product reads in another order than the saved preset's contiguous one."""
    weights = weights_of(original)
    for path, value in weights_of(restored).items():
        np.testing.assert_array_equal(value, weights[path])
    expected = numpy(original(x))
    for key, value in numpy(restored(x)).items():
        np.testing.assert_allclose(value, expected[key], atol=1e-6, rtol=1e-6)


def test_save_to_preset_round_trip(tiny_vit_checkpoints, tmp_path):
    backbone = ViTBackbone.from_preset(str(tiny_vit_checkpoints["model"]))
    run_preset_test(backbone, str(tmp_path / "preset"), images(seed=3)[1], atol=1e-6, rtol=1e-6)


def test_a_resized_model_saves_and_reloads_at_its_size(tiny_vit_checkpoints, tmp_path):
    path = str(tiny_vit_checkpoints["model"])
    resized = ViTBackbone.from_preset(path, image_size=(32, 48))
    resized.save_to_preset(tmp_path / "resized")
    restored = ViTBackbone.from_preset(str(tmp_path / "resized"))
    assert restored.image_size == (32, 48) and restored.get_config() == resized.get_config()
    _, ours = images(32, 48, seed=4)
    _assert_restored(restored, resized, ours)
    expected = numpy(resized(ours))

    # A native preset resizes like a transformers checkpoint.
    ViTBackbone.from_preset(path).save_to_preset(tmp_path / "native")
    from_native = ViTBackbone.from_preset(str(tmp_path / "native"), image_size=(32, 48))
    for key, value in numpy(from_native(ours)).items():
        np.testing.assert_allclose(value, expected[key], atol=1e-6)


def test_classifier_head_labels_and_logits(tiny_vit_checkpoints):
    path = tiny_vit_checkpoints["classifier"]
    reference = transformers.ViTForImageClassification.from_pretrained(path).eval()
    theirs, ours = images(seed=5)
    with torch.no_grad():
        expected = reference(theirs).logits.numpy()
    classifier = ViTImageClassifier.from_preset(str(path), preprocessor=None)
    assert classifier.num_classes == 3 and classifier.class_names == ["cat", "dog", "bird"]
    np.testing.assert_allclose(keras.ops.convert_to_numpy(classifier(ours)), expected, atol=ATOL)

    # Tasks that take no labels get none; other checkpoints give none.
    source = PresetSource(str(path))
    converter = converter_for(source.config(), source.description)
    assert converter.task_config(Task, source, source.config()) == {}
    model_source = PresetSource(str(tiny_vit_checkpoints["model"]))
    assert converter.task_config(ViTImageClassifier, model_source, model_source.config()) == {}


def test_fit_runs_and_updates_the_weights(tiny_vit_checkpoints):
    classifier = ViTImageClassifier.from_preset(str(tiny_vit_checkpoints["classifier"]), preprocessor=None)
    classifier.compile(optimizer=keras.optimizers.SGD(0.1), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    _, ours = images(batch=4, seed=6)
    before = keras.ops.convert_to_numpy(classifier.backbone.position_embedding.patch_positions).copy()
    history = classifier.fit(ours, np.array([0, 1, 2, 0]), batch_size=2, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    after = keras.ops.convert_to_numpy(classifier.backbone.position_embedding.patch_positions)
    assert not np.array_equal(before, after)


def test_preprocessor_settings(tiny_vit_checkpoints, tmp_path):
    path = shutil.copytree(tiny_vit_checkpoints["classifier"], tmp_path / "checkpoint")
    source = PresetSource(str(path))
    converter = converter_for(source.config(), source.description)
    assert converter.preprocessor_config(source, source.config()) == {  # no preprocessor_config.json
        "image_size": (32, 32), "do_resize": True, "resample": "bilinear", "do_rescale": True,
        "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": [0.5] * 3, "image_std": [0.5] * 3,
    }
    transformers.ViTImageProcessor(
        size={"height": 40, "width": 48}, resample=3, image_mean=[0.485, 0.456, 0.406],
        image_std=[0.229, 0.224, 0.225], do_rescale=False,
    ).save_pretrained(path)
    assert converter.preprocessor_config(PresetSource(str(path)), source.config()) == {
        "image_size": (40, 48), "do_resize": True, "resample": "bicubic", "do_rescale": False,
        "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": [0.485, 0.456, 0.406],
        "image_std": [0.229, 0.224, 0.225],
    }
    (path / "preprocessor_config.json").write_text(json.dumps({"size": 64, "image_mean": 0.5}))
    settings = converter.preprocessor_config(PresetSource(str(path)), source.config())
    assert settings["image_size"] == (64, 64) and settings["image_mean"] == [0.5]
    (path / "preprocessor_config.json").write_text(json.dumps({"size": {"shortest_edge": 64}}))
    with pytest.raises(ValueError, match="'size' in preprocessor_config.json .* is {'shortest_edge': 64}"):
        converter.preprocessor_config(PresetSource(str(path)), source.config())


def test_qkv_bias_false(tmp_path):
    torch.manual_seed(1)
    model = perturbed(transformers.ViTModel(transformers.ViTConfig(**TINY_VIT, qkv_bias=False)), 30)
    model.save_pretrained(tmp_path)
    theirs, ours = images(seed=7)
    with torch.no_grad():
        expected = model(theirs).last_hidden_state.numpy()
    output = numpy(ViTBackbone.from_preset(str(tmp_path))(ours))["sequence_output"]
    np.testing.assert_allclose(output, expected, atol=ATOL)


def test_unsupported_variants_are_rejected(tiny_vit_checkpoints, tmp_path):
    path = shutil.copytree(tiny_vit_checkpoints["model"], tmp_path / "checkpoint")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "hidden_act": "mish"}))
    with pytest.raises(ValueError, match="'hidden_act' is 'mish', an activation this library lacks"):
        ViTBackbone.from_preset(str(path))
    (path / "config.json").write_text(json.dumps({**config, "pooler_act": "relu"}))
    with pytest.raises(ValueError, match="'pooler_act' 'relu'.*use_pooler=False"):
        ViTBackbone.from_preset(str(path))
    assert not ViTBackbone.from_preset(str(path), use_pooler=False).use_pooler
    (path / "config.json").write_text(json.dumps({**config, "image_size": 40}))
    with pytest.raises(ValueError, match=r"position_embeddings' has shape \(1, 17, 32\).*\(5, 5\) patch grid"):
        ViTBackbone.from_preset(str(path))


def tiny_backbone(**overrides):
    arguments = dict(image_size=16, patch_size=8, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16)
    return ViTBackbone(**{**arguments, **overrides})


def test_bad_inputs_raise():
    backbone = tiny_backbone(image_size=(16, 24))
    with pytest.raises(ValueError, match=r"'images' are \(16, 16\) \(height, width\).*built for \(16, 24\).*image_size=\(16, 16\)"):
        backbone({"images": np.zeros((1, 16, 16, 3), "float32")})
    with pytest.raises(ValueError, match=r"has 1 channels \(the last axis\), but this ViTBackbone takes 3\.$"):
        backbone({"images": np.zeros((1, 16, 24, 1), "float32")})
    with pytest.raises(ValueError, match="has 24 channels.*It looks channels-first"):
        backbone({"images": np.zeros((1, 3, 16, 24), "float32")})
    with pytest.raises(ValueError, match=r"shaped \(batch, height, width, channels\); got shape \(16, 24, 3\)"):
        backbone({"images": np.zeros((16, 24, 3), "float32")})


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="Unknown attention mechanism 'nope'"):
        tiny_backbone(attention="nope")
    with pytest.raises(ValueError, match=r"image_size \(4, 16\) is smaller than patch_size \(8, 8\)"):
        tiny_backbone(image_size=(4, 16))
    with pytest.raises(ValueError, match="image_size must be a positive int or a"):
        tiny_backbone(image_size=(16, 16, 3))


def test_backbone_behaviour(tmp_path):
    arguments = dict(image_size=16, patch_size=8, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16)
    run_backbone_test(
        ViTBackbone, arguments, images(16, 16)[1], {"sequence_output": (2, 5, 8)}, tmp_path,
        variable_input_data=[(images(16, 16, batch=3)[1], {"sequence_output": (3, 5, 8)})],
    )


def test_config_round_trip_and_bfloat16():
    arguments = dict(image_size=(16, 24), patch_size=(8, 4), use_pooler=True)
    x = {"images": np.zeros((2, 16, 24, 3), "float32")}
    rebuilt = run_config_round_trip_test(tiny_backbone(**arguments, dtype="bfloat16"), x)
    assert rebuilt.grid_size == (2, 6) and {v.dtype for v in rebuilt.weights} == {"bfloat16"}
    outputs = run_precision_test(tiny_backbone, arguments, x, policy="bfloat16")
    assert tuple(outputs["sequence_output"].shape) == (2, 13, 8)
