"""Local attention (Image Transformer, Parmar et al., 2018) against dense
softmax attention softmax(QKᵀ/√d + M)V in numpy, with M the local window
built here independently, position by position, from the definitions:

* 1D: query i (block ⌊i/b⌋) sees key j iff ⌊i/b⌋ − m ≤ ⌊j/b⌋ ≤ ⌊i/b⌋ + m
  (right bound ⌊i/b⌋ and j ≤ i when causal);
* 2D: the query's block extended by f_h rows above (and below unless
  causal) and f_w columns left and right, clipped to the image; when
  causal, only pixels at or before the query in sequence order (raster or
  the Image Transformer's block-raster order).
"""

import itertools

import keras
import numpy as np
import pytest

from attention_zoo_keras import backend_support
from attention_zoo_keras.attention import local
from attention_zoo_keras.attention import local_2d
from attention_zoo_keras.attention.registry import get_mechanism
from tests.support.attention_gradients import dense_attention
from tests.support.attention_gradients import gradients


def numpy(x):
    return keras.ops.convert_to_numpy(x)


def reference_attention(query, key, value, mask):
    """numpy float64; `mask` broadcastable to (B, N, T, S). Rows with no
    visible key are returned as NaN (callers compare the others)."""
    query, key, value = (np.asarray(t, np.float64) for t in (query, key, value))
    logits = np.einsum("btnh,bsnh->bnts", query, key) / np.sqrt(query.shape[-1])
    logits = np.where(mask, logits, -np.inf)
    with np.errstate(invalid="ignore"):
        logits -= logits.max(-1, keepdims=True)
        weights = np.exp(logits)
        weights /= weights.sum(-1, keepdims=True)
    return np.einsum("bnts,bsnh->btnh", weights, value)


def assert_matches(out, expected, atol=1e-5):
    """Equal on every (batch, position, head) whose reference row is defined."""
    defined = np.isfinite(expected).all(-1)
    assert defined.any()
    np.testing.assert_allclose(numpy(out)[defined], expected[defined], atol=atol)


def random_qkv(length, batch=2, heads=3, dim=4, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((batch, length, heads, dim)).astype("float32") for _ in range(3)]


def window_1d(length, block, memory_blocks, causal):
    mask = np.zeros((length, length), bool)
    for i, j in itertools.product(range(length), repeat=2):
        low, high = i // block - memory_blocks, i // block + (0 if causal else memory_blocks)
        mask[i, j] = low <= j // block <= high and (j <= i or not causal)
    return mask


def sequence_position(row, col, image_shape, block_shape, layout):
    height, width = image_shape
    if layout == "raster":
        return row * width + col
    block_h, block_w = block_shape
    block = (row // block_h) * (width // block_w) + col // block_w
    return block * block_h * block_w + (row % block_h) * block_w + col % block_w


def window_2d(image_shape, block_shape, flange, causal, layout="raster"):
    height, width = image_shape
    (block_h, block_w), (flange_h, flange_w) = block_shape, flange
    pixels = list(itertools.product(range(height), range(width)))
    mask = np.zeros((height * width, height * width), bool)
    for (row, col), (key_row, key_col) in itertools.product(pixels, repeat=2):
        top, left = row // block_h * block_h, col // block_w * block_w
        rows = (top - flange_h, top + block_h + (0 if causal else flange_h))
        cols = (left - flange_w, left + block_w + flange_w)
        inside = rows[0] <= key_row < rows[1] and cols[0] <= key_col < cols[1]
        i = sequence_position(row, col, image_shape, block_shape, layout)
        j = sequence_position(key_row, key_col, image_shape, block_shape, layout)
        mask[i, j] = inside and (j <= i or not causal)
    return mask


def key_padding(length, real_lengths):
    return np.arange(length)[None, :] < np.asarray(real_lengths)[:, None]


# --- the masks ------------------------------------------------------------


def test_registered():
    assert get_mechanism("local") is local.local_attention
    assert get_mechanism("local_2d") is local_2d.local_attention_2d


def test_1d_window_hand_written():
    """Blocks of 2 over 6 positions, one memory block."""
    causal = numpy(local.local_mask(6, block_size=2, num_memory_blocks=1, is_causal=True))
    assert set(np.flatnonzero(causal[3])) == {0, 1, 2, 3}  # blocks 0 and 1, j ≤ 3
    assert set(np.flatnonzero(causal[4])) == {2, 3, 4}  # blocks 1 and 2, j ≤ 4
    assert set(np.flatnonzero(causal[0])) == {0}
    both_sides = numpy(local.local_mask(6, block_size=2, num_memory_blocks=1))
    assert set(np.flatnonzero(both_sides[2])) == {0, 1, 2, 3, 4, 5}
    assert set(np.flatnonzero(both_sides[0])) == {0, 1, 2, 3}
    own_block = numpy(local.local_mask(6, block_size=2, num_memory_blocks=0))
    assert set(np.flatnonzero(own_block[5])) == {4, 5}


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("length,block,memory_blocks", [(1, 4, 1), (7, 3, 1), (12, 4, 2), (9, 2, 0), (5, 16, 1)])
def test_1d_mask_matches_definition(length, block, memory_blocks, causal):
    got = numpy(local.local_mask(length, block, memory_blocks, causal))
    np.testing.assert_array_equal(got, window_1d(length, block, memory_blocks, causal))


def test_2d_memory_geometry_hand_written():
    """4×4 image, 2×2 query blocks, flange (1, 1). The pixel (2, 2) is the
    top-left of block (1, 1); its memory (tensor2tensor's
    masked_local_attention_2d): the top region row 1 × cols 1…4, the left
    region rows 2…3 × col 1, and itself (the first pixel of its block)."""

    def visible(image_shape, block, flange, causal, layout, pixel):
        mask = numpy(local_2d.local_mask_2d(image_shape, block, flange, causal, layout))
        position = sequence_position(*pixel, image_shape, block, layout)
        pixels = itertools.product(range(image_shape[0]), range(image_shape[1]))
        return {p for p in pixels if mask[position, sequence_position(*p, image_shape, block, layout)]}

    top = {(1, 1), (1, 2), (1, 3)}  # (1, 4) is outside the image
    assert visible((4, 4), (2, 2), (1, 1), True, "block_raster", (2, 2)) == top | {(2, 1), (3, 1), (2, 2)}
    block = {(2, 2), (2, 3), (3, 2), (3, 3)}
    assert visible((4, 4), (2, 2), (1, 1), True, "block_raster", (3, 3)) == top | {(2, 1), (3, 1)} | block
    # The last pixel of block (1, 0) does not see the right flank (2, 2), (3, 2): a later block.
    assert visible((4, 4), (2, 2), (1, 1), True, "block_raster", (3, 1)) == {
        (1, 0), (1, 1), (1, 2), (2, 0), (2, 1), (3, 0), (3, 1)
    }
    # Raster order: (3, 1) is after (2, 2); the flank to the right of the rows above is before.
    assert visible((4, 4), (2, 2), (1, 1), True, "raster", (2, 2)) == top | {(2, 1), (2, 2)}
    assert visible((4, 4), (2, 2), (1, 1), True, "raster", (3, 1)) == {
        (1, 0), (1, 1), (1, 2), (2, 0), (2, 1), (2, 2), (3, 0), (3, 1)
    }
    # Non-causal: the block plus one pixel on every side, clipped to the image.
    assert visible((4, 4), (2, 2), (1, 1), False, "raster", (0, 0)) == set(itertools.product(range(3), range(3)))
    assert visible((4, 4), (2, 2), (1, 1), False, "raster", (2, 2)) == set(itertools.product(range(1, 4), range(1, 4)))


SHAPES_2D = [
    ((4, 4), (2, 2), (1, 1)),
    ((5, 7), (2, 3), (1, 2)),
    ((6, 4), (3, 2), (0, 1)),
    ((3, 5), (1, 5), (2, 0)),
    ((3, 2), (8, 8), (1, 1)),  # a block larger than the image
]
CASES_2D = [
    (image_shape, block, flange, layout)
    for image_shape, block, flange in SHAPES_2D
    for layout in ("raster", "block_raster")
    if layout == "raster" or not (image_shape[0] % block[0] or image_shape[1] % block[1])
]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("image_shape,block,flange,layout", CASES_2D)
def test_2d_mask_matches_definition(image_shape, block, flange, layout, causal):
    got = numpy(local_2d.local_mask_2d(image_shape, block, flange, causal, layout))
    np.testing.assert_array_equal(got, window_2d(image_shape, block, flange, causal, layout))


# --- 1D attention -----------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    "length,block,memory_blocks", [(1, 4, 1), (8, 4, 1), (13, 4, 1), (13, 3, 2), (10, 3, 0), (6, 16, 1)]
)
def test_1d_matches_dense_softmax(length, block, memory_blocks, causal):
    q, k, v = random_qkv(length)
    out = local.local_attention(q, k, v, is_causal=causal, block_size=block, num_memory_blocks=memory_blocks)
    assert tuple(out.shape) == (2, length, 3, 4)
    assert_matches(out, reference_attention(q, k, v, window_1d(length, block, memory_blocks, causal)))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("length,block", [(9, 4), (12, 4), (7, 2)])
def test_1d_key_padding(length, block, causal):
    q, k, v = random_qkv(length, seed=1)
    padding = key_padding(length, [length, length - 3])
    mask = padding[:, None, None, :]
    out = local.local_attention(q, k, v, attention_mask=mask, is_causal=causal, block_size=block)
    expected = reference_attention(q, k, v, mask & window_1d(length, block, 1, causal))
    assert_matches(out, expected)
    # Padded keys and values do not matter.
    k2, v2 = k.copy(), v.copy()
    k2[1, length - 3 :], v2[1, length - 3 :] = 100.0, -100.0
    out2 = local.local_attention(q, k2, v2, attention_mask=mask, is_causal=causal, block_size=block)
    np.testing.assert_allclose(numpy(out2)[1, : length - 3], numpy(out)[1, : length - 3], atol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_1d_general_mask_is_intersected_with_the_window(causal):
    length = 11
    q, k, v = random_qkv(length, heads=2, seed=2)
    rng = np.random.default_rng(3)
    mask = rng.random((2, 2, length, length)) < 0.6  # per batch element and head
    mask |= np.eye(length, dtype=bool)
    out = local.local_attention(q, k, v, attention_mask=mask, is_causal=causal, block_size=3)
    assert_matches(out, reference_attention(q, k, v, mask & window_1d(length, 3, 1, causal)))
    # Broadcast shapes: (T, S) and (B, 1, T, S).
    for shaped in (mask[0, 0], mask[:, :1]):
        out = local.local_attention(q, k, v, attention_mask=shaped, is_causal=causal, block_size=3)
        assert_matches(out, reference_attention(q, k, v, shaped & window_1d(length, 3, 1, causal)))


def test_1d_block_of_the_whole_sequence_is_softmax():
    q, k, v = random_qkv(9)
    out = local.local_attention(q, k, v, is_causal=True, block_size=9)
    assert_matches(out, reference_attention(q, k, v, np.tril(np.ones((9, 9), bool))))


# --- 2D attention -----------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("image_shape,block,flange,layout", CASES_2D)
def test_2d_matches_dense_softmax(image_shape, block, flange, layout, causal):
    length = image_shape[0] * image_shape[1]
    q, k, v = random_qkv(length, seed=4)
    out = local_2d.local_attention_2d(
        q, k, v, is_causal=causal, image_shape=image_shape, block_shape=block, memory_flange=flange, layout=layout
    )
    assert tuple(out.shape) == (2, length, 3, 4)
    assert_matches(out, reference_attention(q, k, v, window_2d(image_shape, block, flange, causal, layout)))


@pytest.mark.parametrize("causal", [False, True])
def test_2d_key_padding_and_general_mask(causal):
    image_shape, block, flange = (5, 6), (2, 4), (1, 2)
    length = 30
    q, k, v = random_qkv(length, seed=5)
    window = window_2d(image_shape, block, flange, causal)
    padding = key_padding(length, [length, 21])[:, None, None, :]
    kwargs = dict(is_causal=causal, image_shape=image_shape, block_shape=block, memory_flange=flange)
    out = local_2d.local_attention_2d(q, k, v, attention_mask=padding, **kwargs)
    assert_matches(out, reference_attention(q, k, v, padding & window))
    general = (np.random.default_rng(6).random((2, 1, length, length)) < 0.5) | np.eye(length, dtype=bool)
    out = local_2d.local_attention_2d(q, k, v, attention_mask=general, **kwargs)
    assert_matches(out, reference_attention(q, k, v, general & window))


def test_2d_errors():
    q = np.zeros((1, 12, 1, 2), "float32")
    with pytest.raises(ValueError, match="image_shape"):
        local_2d.local_attention_2d(q, q, q)
    with pytest.raises(ValueError, match="not the number of pixels"):
        local_2d.local_attention_2d(q, q, q, image_shape=(3, 5))
    with pytest.raises(ValueError, match="tiled exactly"):
        local_2d.local_attention_2d(q, q, q, image_shape=(3, 4), block_shape=(2, 2), layout="block_raster")
    with pytest.raises(ValueError, match="Unknown layout"):
        local_2d.local_attention_2d(q, q, q, image_shape=(3, 4), layout="zigzag")


def test_needs_self_attention():
    q, k, v = random_qkv(6)
    with pytest.raises(ValueError, match="query and key lengths must be equal"):
        local.local_attention(q[:, :1], k, v)
    with pytest.raises(ValueError, match="block_size"):
        local.local_attention(q, k, v, block_size=0)


# --- compiled, symbolic, gradients, dropout, memory -------------------------


def test_compiled():
    q, k, v = random_qkv(12)
    padding = key_padding(12, [12, 9])[:, None, None, :]

    def attend(query, key, value, mask):
        one = local.local_attention(query, key, value, attention_mask=mask, is_causal=True, block_size=5)
        two = local_2d.local_attention_2d(
            query, key, value, attention_mask=mask, image_shape=(3, 4), block_shape=(2, 2), memory_flange=(1, 1)
        )
        return one, two

    one, two = backend_support.compile_inference(attend, [])(q, k, v, padding)
    assert_matches(one, reference_attention(q, k, v, padding & window_1d(12, 5, 1, True)))
    assert_matches(two, reference_attention(q, k, v, padding & window_2d((3, 4), (2, 2), (1, 1), False)))


class _SelfAttention(keras.layers.Layer):
    def call(self, x, mask):
        heads = keras.ops.reshape(x, (keras.ops.shape(x)[0], keras.ops.shape(x)[1], 2, 3))
        mask = keras.ops.expand_dims(keras.ops.expand_dims(keras.ops.cast(mask, "bool"), 1), 1)
        out = local.local_attention(heads, heads, heads, attention_mask=mask, is_causal=True, block_size=3)
        return keras.ops.reshape(out, keras.ops.shape(x))


def test_functional_model_with_unknown_length():
    x = keras.Input((None, 6))
    mask = keras.Input((None,), dtype="int32")
    model = keras.Model([x, mask], _SelfAttention()(x, mask))
    data = np.random.default_rng(0).standard_normal((2, 7, 6)).astype("float32")
    padding = np.array([[1] * 7, [1] * 5 + [0] * 2], "int32")
    heads = data.reshape(2, 7, 2, 3)
    mask = padding.astype(bool)[:, None, None, :] & window_1d(7, 3, 1, True)
    expected = reference_attention(heads, heads, heads, mask)
    np.testing.assert_allclose(numpy(model([data, padding])), expected.reshape(2, 7, 6), atol=1e-5)
    np.testing.assert_allclose(model.predict([data, padding], verbose=0), expected.reshape(2, 7, 6), atol=1e-5)


@pytest.mark.parametrize("form", ["1d", "2d"])
def test_gradients_match_dense_softmax(form):
    inputs = random_qkv(10, seed=7)
    padding = key_padding(10, [10, 8])[:, None, None, :]
    if form == "1d":
        window = window_1d(10, 3, 1, True)
        blockwise = lambda q, k, v: local.local_attention(  # noqa: E731
            q, k, v, attention_mask=padding, is_causal=True, block_size=3
        )
    else:
        window = window_2d((2, 5), (1, 2), (1, 1), True)
        blockwise = lambda q, k, v: local_2d.local_attention_2d(  # noqa: E731
            q, k, v, attention_mask=padding, is_causal=True,
            image_shape=(2, 5), block_shape=(1, 2), memory_flange=(1, 1),
        )
    dense = lambda q, k, v: dense_attention(q, k, v, padding & window)  # noqa: E731
    for got, expected in zip(gradients(blockwise, inputs), gradients(dense, inputs)):
        assert np.isfinite(numpy(got)).all()
        np.testing.assert_allclose(numpy(got), numpy(expected), atol=1e-4, rtol=1e-4)


def test_dropout():
    q, k, v = random_qkv(10)
    inference = numpy(local.local_attention(q, k, v, is_causal=True, block_size=4))
    negligible = local.local_attention(
        q, k, v, is_causal=True, block_size=4, dropout_rate=1e-9, training=True,
        seed_generator=keras.random.SeedGenerator(0),
    )
    np.testing.assert_allclose(numpy(negligible), inference, atol=1e-5)
    dropped = local.local_attention(
        q, k, v, is_causal=True, block_size=4, dropout_rate=0.5, training=True,
        seed_generator=keras.random.SeedGenerator(0),
    )
    assert not np.allclose(numpy(dropped), inference, atol=1e-3)
    # Inverted dropout on the probabilities only: with all-ones values the mean output stays 1.
    rng = np.random.default_rng(0)
    q, k = (rng.standard_normal((4, 64, 8, 4)).astype("float32") for _ in range(2))
    keras.utils.set_random_seed(0)
    out = numpy(
        local_2d.local_attention_2d(
            q, k, np.ones_like(q), image_shape=(8, 8), block_shape=(4, 4), memory_flange=(2, 2),
            dropout_rate=0.25, training=True, seed_generator=keras.random.SeedGenerator(0),
        )
    )
    assert abs(out.mean() - 1.0) < 0.02 and out.std() > 0.05


def test_long_sequence_without_a_length_squared_matrix():
    """L = 2^16: an L×L float32 matrix would be 16 GiB; with blocks of 32 and
    one memory block each query block needs 32×64 logits."""
    length = 2**16
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, length, 1, 2)).astype("float32") for _ in range(3))
    out = numpy(local.local_attention(q, k, v, is_causal=True, block_size=32))
    assert out.shape == (1, length, 1, 2) and np.isfinite(out).all()
    # The last position: softmax over keys L − 64 … L − 1 (its block and the previous one).
    keys = slice(length - 64, length)
    logits = k[0, keys, 0] @ q[0, -1, 0] / np.sqrt(2)
    weights = np.exp(logits - logits.max())
    np.testing.assert_allclose(out[0, -1, 0], weights @ v[0, keys, 0] / weights.sum(), atol=1e-5)
