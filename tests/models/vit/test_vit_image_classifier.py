"""The ViT image classifier with its image converter against `transformers`'
`ViTForImageClassification` and its Pillow image processor on the same uint8
images of assorted sizes (logits within 1e-4), at the trained resolution and
at another one; class names and top-k; new heads; saving; the converter's
input handling; a lone array of images taken as the `images` input; and
training on a real data set (scikit-learn's digits)."""

import warnings

import keras
import numpy as np
import pytest
import torch
import transformers
from PIL import Image

from attention_zoo_keras.models.vit import ViTBackbone
from attention_zoo_keras.models.vit import ViTImageClassifier
from attention_zoo_keras.models.vit import ViTImageConverter
from tests.support.family_tests import run_preset_test
from tests.support.tiny_checkpoints import perturbed
from tests.support.tiny_checkpoints import TINY_VIT

ATOL = 1e-4
LABELS = {0: "cat", 1: "dog", 2: "bird", 3: "fish"}


@pytest.fixture(scope="module")
def classifier_checkpoint(tmp_path_factory):
    """A tiny random-weight `ViTForImageClassification` (4 named classes,
    32x32 images) with a Pillow image processor using ImageNet statistics."""
    path = tmp_path_factory.mktemp("tiny_vit_classifier")
    torch.manual_seed(1)
    config = transformers.ViTConfig(**TINY_VIT, id2label=LABELS, label2id={v: k for k, v in LABELS.items()})
    perturbed(transformers.ViTForImageClassification(config), 31).save_pretrained(path)
    processor().save_pretrained(path)
    return path


def processor(size=32):
    return transformers.ViTImageProcessorPil(
        size={"height": size, "width": size}, image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225]
    )


def uint8_images(seed=0):
    """RGB uint8 images of different sizes, some larger and some smaller than 32."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, size=shape, dtype=np.uint8) for shape in [(45, 61, 3), (32, 32, 3), (20, 27, 3)]]


def reference_logits(path, images, size=32):
    model = transformers.ViTForImageClassification.from_pretrained(path).eval()
    pixels = processor(size)(images=images, return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        return model(pixels, interpolate_pos_encoding=size != 32).logits.numpy()


def test_predict_on_raw_images_matches_transformers(classifier_checkpoint):
    images = uint8_images()
    classifier = ViTImageClassifier.from_preset(str(classifier_checkpoint))
    assert classifier.class_names == ["cat", "dog", "bird", "fish"]
    converter = classifier.preprocessor
    assert converter.image_size == (32, 32)
    np.testing.assert_allclose(converter.image_mean, [0.485, 0.456, 0.406], rtol=1e-6)

    # The converter gives transformers' pixel values exactly (same Pillow resize).
    expected_pixels = processor()(images=images, return_tensors="np")["pixel_values"].transpose(0, 2, 3, 1)
    np.testing.assert_allclose(converter(images)["images"], expected_pixels, atol=1e-6)

    expected = reference_logits(classifier_checkpoint, images)
    np.testing.assert_allclose(classifier.predict(images, verbose=0), expected, atol=ATOL)

    top = classifier.predict(images, top_k=2, verbose=0)
    probabilities = np.exp(expected) / np.exp(expected).sum(-1, keepdims=True)
    for row, pairs in zip(probabilities, top):
        best = np.argsort(-row)[:2]
        assert [name for name, _ in pairs] == [LABELS[i] for i in best]
        np.testing.assert_allclose([p for _, p in pairs], row[best], atol=1e-5)


@pytest.mark.parametrize("image_size", [48, 24])
def test_another_resolution_matches_interpolate_pos_encoding(classifier_checkpoint, image_size):
    images = uint8_images(seed=2)
    classifier = ViTImageClassifier.from_preset(str(classifier_checkpoint), image_size=image_size)
    assert classifier.backbone.image_size == (image_size, image_size)
    assert classifier.preprocessor.image_size == (image_size, image_size)
    expected = reference_logits(classifier_checkpoint, images, size=image_size)
    np.testing.assert_allclose(classifier.predict(images, verbose=0), expected, atol=ATOL)


def test_new_head_keeps_the_backbone(classifier_checkpoint):
    pretrained = ViTImageClassifier.from_preset(str(classifier_checkpoint))
    fresh = ViTImageClassifier.from_preset(str(classifier_checkpoint), num_classes=10, pooling="mean")
    assert fresh.num_classes == 10 and fresh.class_names is None
    assert fresh.predict(uint8_images(), verbose=0).shape == (3, 10)
    batch = pretrained.preprocessor(uint8_images())
    for ours, theirs in zip(fresh.backbone.weights, pretrained.backbone.weights):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(ours), keras.ops.convert_to_numpy(theirs))
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(fresh.backbone(batch)["sequence_output"]),
        keras.ops.convert_to_numpy(pretrained.backbone(batch)["sequence_output"]),
        atol=1e-6,
    )
    named = ViTImageClassifier.from_preset(str(classifier_checkpoint), num_classes=2, class_names=["no", "yes"])
    assert named.predict(uint8_images(), top_k=1, verbose=0)[0][0][0] in ("no", "yes")


def test_save_and_reload_with_the_converter(classifier_checkpoint, tmp_path):
    classifier = ViTImageClassifier.from_preset(str(classifier_checkpoint), image_size=40)
    images = uint8_images(seed=3)
    reloaded = run_preset_test(
        classifier, str(tmp_path / "preset"), images, outputs=lambda model: model.predict(images, verbose=0), atol=1e-6,
    )
    assert (tmp_path / "preset" / "preprocessor.json").exists()
    assert not (tmp_path / "preset" / "tokenizer.json").exists()
    assert reloaded.class_names == classifier.class_names and reloaded.preprocessor.image_size == (40, 40)


def test_converter_inputs():
    converter = ViTImageConverter(image_size=(16, 20), image_mean=0.0, image_std=1.0, rescale_factor=1.0)
    rgb = np.random.default_rng(0).integers(0, 256, size=(30, 40, 3), dtype=np.uint8)
    single = converter(rgb)["images"]
    assert single.shape == (1, 16, 20, 3) and single.dtype == np.float32
    # A PIL image, a float image on the 0-255 scale, grayscale and RGBA.
    np.testing.assert_array_equal(converter([Image.fromarray(rgb)])["images"], single)
    as_float = converter(rgb.astype("float32"))["images"]
    np.testing.assert_allclose(as_float, single, atol=1.0)  # uint8: Pillow rounds after each of its two passes
    gray = converter(rgb[:, :, 0])["images"]
    np.testing.assert_array_equal(gray[..., 0], gray[..., 2])
    np.testing.assert_array_equal(converter(np.concatenate([rgb, rgb[:, :, :1]], -1))["images"], single)
    # A batch array and labels pass through.
    features, labels = converter(np.stack([rgb, rgb]), np.array([1, 2]))
    assert features["images"].shape == (2, 16, 20, 3) and labels.tolist() == [1, 2]
    assert converter.num_examples([rgb, rgb[:10]]) == 2

    with pytest.raises(ValueError, match=r"Image 0 has shape \(30, 40, 2\): 2 channels, but the model takes 3"):
        converter(rgb[:, :, :2])
    with pytest.raises(ValueError, match="do_resize is off"):
        ViTImageConverter(image_size=16, do_resize=False)(rgb)
    with pytest.raises(TypeError, match="ViTImageConverter takes an image"):
        converter("not an image")
    with pytest.raises(ValueError, match="resample must be one of"):
        ViTImageConverter(resample="cubic")
    with pytest.raises(ValueError, match="image_mean has 2 values for 3 channels"):
        ViTImageConverter(image_mean=[0.5, 0.5])
    with pytest.raises(ValueError, match="preprocessor resizes to"):
        ViTImageClassifier(ViTBackbone(image_size=16, patch_size=8, num_layers=1, num_heads=2, hidden_dim=8,
                                       intermediate_dim=8), num_classes=2, preprocessor=ViTImageConverter(image_size=32))


def test_classifier_argument_errors():
    backbone = ViTBackbone(image_size=16, patch_size=8, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=8)
    with pytest.raises(ValueError, match="pooling must be one of"):
        ViTImageClassifier(backbone, num_classes=2, pooling="max")
    with pytest.raises(ValueError, match="Got 3 class_names for 2 classes"):
        ViTImageClassifier(backbone, num_classes=2, class_names=["a", "b", "c"])
    classifier = ViTImageClassifier(backbone, num_classes=2)
    with pytest.raises(ValueError, match=r"top_k must be an int in \[1, 2\]"):
        classifier.predict({"images": np.zeros((1, 16, 16, 3), "float32")}, top_k=5, verbose=0)


def test_a_lone_array_of_images_is_the_images_input():
    """Images given bare (not as `{"images": ...}`) reach the model as its
    one input by every path, without Keras' input-structure warning, and get
    the library's checks."""
    backbone = ViTBackbone(image_size=16, patch_size=8, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=8)
    classifier = ViTImageClassifier(backbone, num_classes=3)
    classifier.compile(optimizer=keras.optimizers.SGD(0.0))
    rng = np.random.default_rng(0)
    images = rng.random((4, 16, 16, 3)).astype("float32")
    labels = np.array([0, 1, 2, 1], "int32")
    expected = keras.ops.convert_to_numpy(classifier({"images": images}))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        np.testing.assert_allclose(keras.ops.convert_to_numpy(classifier(images)), expected, atol=1e-6)
        np.testing.assert_allclose(classifier.predict(images, verbose=0), expected, atol=1e-6)
        np.testing.assert_allclose(classifier.predict_on_batch(images), expected, atol=1e-6)
        classifier.fit(images, labels, validation_data=(images, labels), batch_size=2, verbose=0)
        classifier.fit(((images, labels) for _ in range(2)), verbose=0)
        classifier.evaluate(images, labels, verbose=0)
        classifier.train_on_batch(images, labels)
    assert not [str(w.message) for w in caught if "structure of `inputs`" in str(w.message)]

    with pytest.raises(ValueError, match=r"'images' are \(20, 20\) \(height, width\), but this ViTBackbone"):
        classifier.predict_on_batch(np.zeros((2, 20, 20, 3), "float32"))
    with pytest.raises(ValueError, match="It looks channels-first"):
        classifier.predict(np.zeros((2, 3, 16, 16), "float32"), verbose=0)
    wrong_size = (np.zeros((2, 20, 20, 3), "float32"), labels[:2])
    with pytest.raises(ValueError, match=r"'images' are \(20, 20\)"):
        classifier.fit((batch for batch in [(images, labels), wrong_size]), verbose=0)
    with pytest.raises(ValueError, match=r"'images' are \(20, 20\)"):
        classifier(np.zeros((2, 20, 20, 3), "float32"))


@pytest.mark.slow
def test_fit_on_digits_learns():
    from sklearn.datasets import load_digits

    keras.utils.set_random_seed(0)  # the initial weights; without a seed an unlucky draw can stay below 0.7
    digits = load_digits()
    images = (digits.images * (255 / 16)).astype("uint8")  # 8x8, 0-16 grey levels
    rng = np.random.default_rng(0)
    order = rng.permutation(len(images))
    train, test = order[:1200], order[1200:]
    backbone = ViTBackbone(
        image_size=16, patch_size=4, num_channels=1, num_layers=2, num_heads=4, hidden_dim=64, intermediate_dim=128
    )
    converter = ViTImageConverter(image_size=16, num_channels=1, image_mean=0.5, image_std=0.5)
    classifier = ViTImageClassifier(backbone, num_classes=10, preprocessor=converter, pooling="mean")
    classifier.compile(optimizer=keras.optimizers.Adam(2e-3))
    test_images = [images[i][:, :, None] for i in test]
    before = classifier.evaluate(test_images, digits.target[test], verbose=0, return_dict=True)["accuracy"]
    classifier.fit([images[i][:, :, None] for i in train], digits.target[train], batch_size=32, epochs=12, verbose=0)
    after = classifier.evaluate(test_images, digits.target[test], verbose=0, return_dict=True)["accuracy"]
    assert before < 0.3 and after > 0.7, (before, after)
