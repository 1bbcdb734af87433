"""ViLBERT's region inputs (`vilbert_region_inputs`): the authors' box
normalisation, global region and padding (facebookresearch/vilbert-multi-task,
`_image_features_reader.py`), grid boxes, and grid features of image
backbones as regions. Expected values are worked out by hand here."""

import keras
import numpy as np
import pytest

from attention_zoo_keras.models.vilbert import ViLBERTBackbone
from attention_zoo_keras.models.vilbert.vilbert_region_inputs import grid_boxes
from attention_zoo_keras.models.vilbert.vilbert_grid_regions import image_grid_regions
from attention_zoo_keras.models.vilbert.vilbert_region_inputs import region_inputs
from attention_zoo_keras.models.vit.vit_backbone import ViTBackbone

# An image 100 high and 200 wide with two boxes (x1, y1, x2, y2).
FEATURES = np.array([[1.0, 2.0, 3.0], [5.0, 6.0, 10.0]])
BOXES = np.array([[20.0, 10.0, 120.0, 60.0], [0.0, 0.0, 200.0, 100.0]])
SIZE = (100, 200)
# x1/w, y1/h, x2/w, y2/h, (y2-y1)(x2-x1)/(wh), by hand.
LOCATIONS = np.array([[0.1, 0.1, 0.6, 0.6, 50 * 100 / 20000], [0.0, 0.0, 1.0, 1.0, 1.0]])


def test_two_box_image_normalisation_and_global_region():
    out = region_inputs([FEATURES], [BOXES], SIZE, max_regions=3)
    assert out["region_features"].dtype == np.float32
    assert out["region_boxes"].dtype == np.float32
    assert out["region_mask"].dtype == np.int32
    np.testing.assert_allclose(out["region_boxes"][0, 1:], LOCATIONS, rtol=1e-6)
    np.testing.assert_array_equal(out["region_boxes"][0, 0], [0, 0, 1, 1, 1])
    np.testing.assert_allclose(out["region_features"][0, 0], [3.0, 4.0, 6.5])
    np.testing.assert_array_equal(out["region_features"][0, 1:], FEATURES)
    np.testing.assert_array_equal(out["region_mask"], [[1, 1, 1]])


def test_padding_and_mask():
    out = region_inputs([FEATURES], [BOXES], SIZE, max_regions=6)
    assert out["region_features"].shape == (1, 6, 3)
    assert out["region_boxes"].shape == (1, 6, 5)
    assert out["region_mask"].shape == (1, 6)
    np.testing.assert_array_equal(out["region_mask"], [[1, 1, 1, 0, 0, 0]])
    np.testing.assert_array_equal(out["region_features"][0, 3:], np.zeros((3, 3)))
    np.testing.assert_array_equal(out["region_boxes"][0, 3:], np.zeros((3, 5)))
    # The padding changes nothing in front of it.
    short = region_inputs([FEATURES], [BOXES], SIZE, max_regions=3)
    np.testing.assert_array_equal(out["region_features"][:, :3], short["region_features"])
    np.testing.assert_array_equal(out["region_boxes"][:, :3], short["region_boxes"])


def test_default_max_regions_is_the_authors_101():
    out = region_inputs([FEATURES], [BOXES], SIZE)
    assert out["region_features"].shape == (1, 101, 3)
    assert out["region_mask"].sum() == 3


def test_ragged_batch_with_an_image_without_boxes():
    features = [FEATURES, np.zeros((0, 3)), np.array([[2.0, -2.0, 4.0]])]
    boxes = [BOXES, np.zeros((0, 4)), np.array([[50.0, 25.0, 150.0, 75.0]])]
    out = region_inputs(features, boxes, SIZE, max_regions=4)
    np.testing.assert_array_equal(out["region_mask"], [[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 0, 0]])
    # Image 1: no regions, so the global feature is zeros; its box is still the whole image.
    np.testing.assert_array_equal(out["region_features"][1], np.zeros((4, 3)))
    np.testing.assert_array_equal(out["region_boxes"][1, 0], [0, 0, 1, 1, 1])
    np.testing.assert_array_equal(out["region_boxes"][1, 1:], np.zeros((3, 5)))
    # Image 2: one region, which is its own mean.
    np.testing.assert_array_equal(out["region_features"][2, :2], [[2, -2, 4], [2, -2, 4]])
    np.testing.assert_allclose(out["region_boxes"][2, 1], [0.25, 0.25, 0.75, 0.75, 0.25], rtol=1e-6)
    np.testing.assert_allclose(out["region_features"][0, 0], [3.0, 4.0, 6.5])


def test_one_batch_array_equals_the_list_of_images():
    features = np.stack([FEATURES, FEATURES[::-1]])
    boxes = np.stack([BOXES, BOXES[::-1]])
    from_array = region_inputs(features, boxes, SIZE, max_regions=5)
    from_list = region_inputs(list(features), list(boxes), SIZE, max_regions=5)
    for name in from_array:
        np.testing.assert_array_equal(from_array[name], from_list[name])
    np.testing.assert_allclose(from_array["region_boxes"][1, 1:3], LOCATIONS[::-1], rtol=1e-6)


def test_per_image_image_sizes():
    box = np.array([[10.0, 20.0, 30.0, 60.0]])
    feature = np.ones((1, 2))
    out = region_inputs([feature, feature], [box, box], [(80, 40), (200, 100)], max_regions=2)
    # (x1/w, y1/h, x2/w, y2/h, area / (wh)) with (h, w) = (80, 40), then (200, 100).
    np.testing.assert_allclose(out["region_boxes"][0, 1], [0.25, 0.25, 0.75, 0.75, 800 / 3200], rtol=1e-6)
    np.testing.assert_allclose(out["region_boxes"][1, 1], [0.1, 0.1, 0.3, 0.3, 800 / 20000], rtol=1e-6)


def test_boxes_on_the_image_border_and_empty_boxes_are_accepted():
    boxes = np.array([[0.0, 0.0, 200.0, 100.0], [200.0, 100.0, 200.0, 100.0]])
    out = region_inputs([FEATURES], [boxes], SIZE, max_regions=3)
    np.testing.assert_array_equal(out["region_boxes"][0, 2], [1, 1, 1, 1, 0])


def test_exactly_max_regions_minus_one_boxes_fit():
    features, boxes = np.ones((4, 2)), np.tile([0.0, 0.0, 1.0, 1.0], (4, 1))
    out = region_inputs([features], [boxes], (1, 1), max_regions=5)
    np.testing.assert_array_equal(out["region_mask"], [[1, 1, 1, 1, 1]])


@pytest.mark.parametrize(
    "box, where",
    [
        ([-1.0, 0.0, 10.0, 10.0], "x1 < 0"),
        ([0.0, -0.5, 10.0, 10.0], "y1 < 0"),
        ([0.0, 0.0, 200.5, 10.0], "x2 > w"),
        ([0.0, 0.0, 10.0, 100.25], "y2 > h"),
        ([30.0, 0.0, 20.0, 10.0], "x1 > x2"),
        ([0.0, 30.0, 10.0, 20.0], "y1 > y2"),
    ],
)
def test_box_outside_the_image_raises(box, where):
    boxes = [BOXES, np.array([BOXES[0], box])]
    with pytest.raises(ValueError, match=r"box 1 of image 1, .* is not inside its image of \(height, width\) = \(100, 200\)") as error:
        region_inputs([FEATURES, FEATURES], boxes, SIZE)
    assert str(box) in str(error.value), where


def test_too_many_regions_raises_and_names_the_global_slot():
    features, boxes = np.ones((5, 2)), np.tile([0.0, 0.0, 1.0, 1.0], (5, 1))
    with pytest.raises(ValueError, match=r"image 0 has 5 regions.*max_regions is 5.*global region takes one") as error:
        region_inputs([features], [boxes], (1, 1), max_regions=5)
    assert "top 4 boxes" in str(error.value)
    assert "raise max_regions to 6" in str(error.value)


def test_feature_and_box_counts_differ_raises():
    with pytest.raises(ValueError, match="image 1 has 2 feature vectors but 1 boxes"):
        region_inputs([FEATURES, FEATURES], [BOXES, BOXES[:1]], SIZE)


def test_feature_widths_differ_raises():
    with pytest.raises(ValueError, match=r"same width.*\[3, 2\]"):
        region_inputs([FEATURES, FEATURES[:, :2]], [BOXES, BOXES], SIZE)


def test_boxes_not_four_wide_raises():
    with pytest.raises(ValueError, match=r"boxes of image 0 must be \(regions, 4\).*\(2, 5\)"):
        region_inputs([FEATURES], [np.concatenate([BOXES, np.ones((2, 1))], axis=1)], SIZE)


def test_batch_size_mismatches_raise():
    with pytest.raises(ValueError, match="features hold 2 images but boxes hold 1"):
        region_inputs([FEATURES, FEATURES], [BOXES], SIZE)
    with pytest.raises(ValueError, match="image_size gives 3 .* pairs but there are 2 images"):
        region_inputs([FEATURES, FEATURES], [BOXES, BOXES], [SIZE, SIZE, SIZE])


@pytest.mark.parametrize("size", [(0, 200), (100, -5), [(100, 200), (100, 0)], (np.nan, 10)])
def test_non_positive_image_size_raises(size):
    with pytest.raises(ValueError, match="must be a positive \\(height, width\\)"):
        region_inputs([FEATURES, FEATURES], [BOXES, BOXES], size)


def test_malformed_image_size_raises():
    with pytest.raises(ValueError, match="image_size must be one \\(height, width\\) pair"):
        region_inputs([FEATURES], [BOXES], (100, 200, 3))


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_features_raise(bad):
    features = FEATURES.copy()
    features[1, 2] = bad
    with pytest.raises(ValueError, match="features of image 1 are not all finite.*region 1"):
        region_inputs([FEATURES, features], [BOXES, BOXES], SIZE)


def test_non_finite_boxes_raise():
    boxes = BOXES.copy()
    boxes[0, 3] = np.nan
    with pytest.raises(ValueError, match="boxes of image 0 are not all finite; box 0"):
        region_inputs([FEATURES], [boxes], SIZE)


def test_wrong_ranks_and_max_regions_raise():
    with pytest.raises(ValueError, match=r"features\[0\] must be 2-D"):
        region_inputs([FEATURES[0]], [BOXES], SIZE)
    with pytest.raises(ValueError, match=r"one \(batch, regions, feature_dim\) array"):
        region_inputs(FEATURES, BOXES, SIZE)
    with pytest.raises(ValueError, match="max_regions must be a positive int"):
        region_inputs([FEATURES], [BOXES], SIZE, max_regions=0)
    with pytest.raises(ValueError, match="hold no images"):
        region_inputs([], [], SIZE)


def test_grid_boxes_values():
    expected = [
        [0, 0, 3, 5],
        [3, 0, 6, 5],
        [0, 5, 3, 10],
        [3, 5, 6, 10],
    ]
    np.testing.assert_array_equal(grid_boxes(2, 2, (10, 6)), expected)
    boxes = grid_boxes(3, 1, (10, 7))
    assert boxes.dtype == np.float32 and boxes.shape == (3, 4)
    np.testing.assert_allclose(boxes, [[0, 0, 7, 10 / 3], [0, 10 / 3, 7, 20 / 3], [0, 20 / 3, 7, 10]], rtol=1e-6)
    # The last row and column end exactly on the image border, so the boxes pass region_inputs' check.
    np.testing.assert_array_equal(grid_boxes(7, 3, (100, 10))[-1, 2:], [10, 100])


def test_grid_boxes_bad_arguments_raise():
    with pytest.raises(ValueError, match="grid_width must be a positive int"):
        grid_boxes(2, 0, (10, 10))
    with pytest.raises(ValueError, match="must be a positive \\(height, width\\)"):
        grid_boxes(2, 2, (10, 0))


def tiny_vit(image_size=16):
    keras.utils.set_random_seed(0)
    return ViTBackbone(image_size=image_size, patch_size=8, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16)


def test_vit_grid_regions_are_its_patches():
    backbone = tiny_vit()
    images = np.random.default_rng(0).normal(size=(3, 16, 16, 3)).astype("float32")
    features, boxes, image_size = image_grid_regions(backbone, images)
    expected = keras.ops.convert_to_numpy(backbone({"images": images})["sequence_output"])[:, 1:]
    assert features.dtype == np.float32 and features.shape == (3, 4, 8)
    np.testing.assert_allclose(features, expected, atol=1e-5)
    assert image_size == (16, 16)
    cells = [[0, 0, 8, 8], [8, 0, 16, 8], [0, 8, 8, 16], [8, 8, 16, 16]]
    assert boxes.shape == (3, 4, 4)
    np.testing.assert_array_equal(boxes, np.tile(cells, (3, 1, 1)))
    in_batches, _, _ = image_grid_regions(backbone, images, batch_size=2)
    np.testing.assert_allclose(in_batches, features, atol=1e-5)


def test_vit_boxes_are_patch_cells_when_the_image_is_not_a_whole_number_of_patches():
    backbone = ViTBackbone(image_size=(20, 16), patch_size=8, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16)
    features, boxes, image_size = image_grid_regions(backbone, np.zeros((1, 20, 16, 3), "float32"))
    assert image_size == (20, 16)
    assert features.shape == (1, 4, 8)
    np.testing.assert_array_equal(boxes[0], [[0, 0, 8, 8], [8, 0, 16, 8], [0, 8, 8, 16], [8, 8, 16, 16]])


def tiny_cnn(input_shape=(16, 16, 3)):
    keras.utils.set_random_seed(0)
    inputs = keras.Input(input_shape)
    return keras.Model(inputs, keras.layers.Conv2D(4, 3, strides=4, padding="same")(inputs))


def test_cnn_grid_regions_are_its_flattened_feature_map():
    cnn = tiny_cnn()
    images = np.random.default_rng(1).normal(size=(2, 16, 16, 3)).astype("float32")
    features, boxes, image_size = image_grid_regions(cnn, images, batch_size=1)
    feature_map = keras.ops.convert_to_numpy(cnn(images))
    assert feature_map.shape == (2, 4, 4, 4)
    assert features.shape == (2, 16, 4) and features.dtype == np.float32
    np.testing.assert_allclose(features, feature_map.reshape(2, 16, 4), atol=1e-5)
    # Row-major: region 1 is map position (0, 1), region 4 is (1, 0).
    np.testing.assert_allclose(features[:, 1], feature_map[:, 0, 1], atol=1e-5)
    np.testing.assert_allclose(features[:, 4], feature_map[:, 1, 0], atol=1e-5)
    assert image_size == (16, 16)
    np.testing.assert_array_equal(boxes[1, [0, 1, 4, 15]], [[0, 0, 4, 4], [4, 0, 8, 4], [0, 4, 4, 8], [12, 12, 16, 16]])


def test_cnn_without_a_fixed_input_size_uses_the_images_size():
    cnn = tiny_cnn(input_shape=(None, None, 3))
    features, boxes, image_size = image_grid_regions(cnn, np.zeros((1, 8, 12, 3), "float32"))
    assert image_size == (8, 12)
    assert features.shape == (1, 6, 4)
    np.testing.assert_array_equal(boxes[0, -1], [8, 4, 12, 8])


def test_backbone_without_a_feature_map_raises():
    inputs = keras.Input((16, 16, 3))
    pooled = keras.layers.GlobalAveragePooling2D()(inputs)
    with pytest.raises(ValueError, match=r"one channels-last feature map.*gives an output of shape \(1, 3\)"):
        image_grid_regions(keras.Model(inputs, pooled), np.zeros((1, 16, 16, 3), "float32"))
    two = keras.Model(inputs, {"a": inputs, "b": pooled})
    with pytest.raises(ValueError, match=r"gives a dict with the keys \['a', 'b'\]"):
        image_grid_regions(two, np.zeros((1, 16, 16, 3), "float32"))
    with pytest.raises(ValueError, match="must be a ViTBackbone or a keras.Model"):
        image_grid_regions(lambda images: images, np.zeros((1, 16, 16, 3), "float32"))


def test_images_of_the_wrong_shape_raise():
    with pytest.raises(ValueError, match=r"do not fit .* \(None, 16, 16, 3\)"):
        image_grid_regions(tiny_cnn(), np.zeros((1, 8, 8, 3), "float32"))
    with pytest.raises(ValueError, match=r"images must be a numpy batch"):
        image_grid_regions(tiny_cnn(), np.zeros((16, 16, 3), "float32"))
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        image_grid_regions(tiny_cnn(), np.zeros((1, 16, 16, 3), "float32"), batch_size=0)


def tiny_vilbert(region_feature_dim):
    keras.utils.set_random_seed(0)
    return ViLBERTBackbone(
        vocabulary_size=50, num_layers=2, num_heads=2, hidden_dim=8, intermediate_dim=16,
        region_feature_dim=region_feature_dim, visual_num_layers=2, visual_num_heads=2, visual_hidden_dim=4,
        visual_intermediate_dim=8, co_attention_dim=4, co_attention_num_heads=2,
        co_attention_text_layers=[1, 2], co_attention_visual_layers=[0, 1], max_sequence_length=8,
    )


def token_inputs(batch):
    ids = np.tile(np.array([[2, 15, 27, 3, 0]], "int32"), (batch, 1))
    return {"token_ids": ids, "segment_ids": np.zeros_like(ids), "padding_mask": (ids > 0).astype("int32")}


def test_end_to_end_detector_regions_into_vilbert():
    backbone = tiny_vilbert(region_feature_dim=3)
    features = [FEATURES, np.zeros((0, 3)), FEATURES[:1]]
    boxes = [BOXES, np.zeros((0, 4)), BOXES[:1]]
    regions = region_inputs(features, boxes, [SIZE, (50, 50), SIZE], max_regions=4)
    out = backbone({**token_inputs(3), **regions})
    shapes = {name: tuple(value.shape) for name, value in out.items()}
    assert shapes == {
        "sequence_output": (3, 5, 8),
        "visual_sequence_output": (3, 4, 4),
        "pooled_output": (3, 4),
        "visual_pooled_output": (3, 4),
    }
    for value in out.values():
        assert np.all(np.isfinite(keras.ops.convert_to_numpy(value)))
    # The mask hides the padding: more padding leaves the real regions' and the text's outputs unchanged.
    longer = backbone({**token_inputs(3), **region_inputs(features, boxes, [SIZE, (50, 50), SIZE], max_regions=7)})
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(longer["sequence_output"]),
        keras.ops.convert_to_numpy(out["sequence_output"]), atol=1e-5,
    )
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(longer["visual_sequence_output"])[0, :3],
        keras.ops.convert_to_numpy(out["visual_sequence_output"])[0, :3], atol=1e-5,
    )


def test_end_to_end_cnn_grid_regions_into_vilbert():
    features, boxes, image_size = image_grid_regions(tiny_cnn(), np.ones((2, 16, 16, 3), "float32"))
    regions = region_inputs(features, boxes, image_size, max_regions=17)
    np.testing.assert_array_equal(regions["region_mask"], np.ones((2, 17)))
    np.testing.assert_allclose(regions["region_boxes"][0, 1], [0, 0, 0.25, 0.25, 1 / 16], rtol=1e-6)
    out = tiny_vilbert(region_feature_dim=4)({**token_inputs(2), **regions})
    assert tuple(out["visual_sequence_output"].shape) == (2, 17, 4)
    assert tuple(out["pooled_output"].shape) == (2, 4)
    for value in out.values():
        assert np.all(np.isfinite(keras.ops.convert_to_numpy(value)))
