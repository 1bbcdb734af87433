"""`resize_patch_positions` against `torch.nn.functional.interpolate(mode="bicubic",
align_corners=False)`: in float64 the two agree to 1e-12 (the same arithmetic);
on float32 grids torch's own float32 rounding leaves up to ~5e-6 (ours computes
in float64 and rounds once), so that comparison uses 1e-5.
"""

import numpy as np
import pytest
import torch

from attention_zoo_keras.models.vit.vit_position_embedding import resize_patch_positions

GRIDS = [
    ((4, 4), (6, 6)),  # up
    ((6, 6), (4, 4)),  # down
    ((4, 4), (4, 6)),  # one axis only, non-square
    ((4, 4), (2, 8)),  # same count, another shape
    ((3, 5), (7, 2)),  # non-square to non-square, up and down at once
    ((14, 14), (24, 24)),  # ViT-B/16: 224 -> 384
    ((24, 24), (14, 14)),
    ((1, 1), (3, 3)),  # every tap clamped
    ((5, 5), (1, 1)),
    ((2, 3), (9, 13)),
    ((7, 7), (7, 7)),  # identity
]


def torch_bicubic(grid, size):
    """What transformers' `ViTEmbeddings.interpolate_pos_encoding` computes on the patch grid."""
    as_image = torch.from_numpy(grid).permute(2, 0, 1)[None]
    resized = torch.nn.functional.interpolate(as_image, size=size, mode="bicubic", align_corners=False)
    return resized[0].permute(1, 2, 0).numpy()


@pytest.mark.parametrize(("source", "target"), GRIDS)
def test_matches_torch_bicubic(source, target):
    grid = np.random.default_rng(0).normal(size=(*source, 8))
    resized = resize_patch_positions(grid, target)
    assert resized.shape == (*target, 8) and resized.dtype == np.float64
    np.testing.assert_allclose(resized, torch_bicubic(grid, target), atol=1e-12)

    grid = grid.astype("float32")
    resized = resize_patch_positions(grid, target)
    assert resized.dtype == np.float32
    np.testing.assert_allclose(resized, torch_bicubic(grid, target), atol=1e-5)


def test_same_size_is_the_identity():
    grid = np.random.default_rng(1).normal(size=(3, 5, 4)).astype("float32")
    np.testing.assert_array_equal(resize_patch_positions(grid, (3, 5)), grid)


def test_an_int_size_is_a_square():
    grid = np.random.default_rng(2).normal(size=(4, 4, 2)).astype("float32")
    np.testing.assert_array_equal(resize_patch_positions(grid, 6), resize_patch_positions(grid, (6, 6)))


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match=r"positions must be \(grid_height, grid_width, dim\); got shape \(17, 8\)"):
        resize_patch_positions(np.zeros((17, 8), "float32"), (4, 4))
    with pytest.raises(ValueError, match="grid_size must be a positive int or a"):
        resize_patch_positions(np.zeros((4, 4, 8), "float32"), (0, 4))
