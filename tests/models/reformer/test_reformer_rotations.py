"""The public way to give a Reformer's LSH layers fixed rotations
(`ReformerBackbone.set_lsh_rotations`, `ReformerAttention.set_rotations`),
as reproducing transformers' hashing needs: the rotations decide the
hashing whatever the LSH `seed` option says, `None` restores the seeded
draw, and
the shape is checked against `lsh_rotations_shape`."""

import keras
import numpy as np
import pytest

from attention_zoo_keras.attention import lsh_rotations_shape
from attention_zoo_keras.models.reformer import ReformerBackbone

HEADS, HEAD_DIM, NUM_HASHES, NUM_BUCKETS = 2, 4, 2, 4


def _backbone(hash_seed):
    keras.utils.set_random_seed(0)
    lsh = {"num_hashes": NUM_HASHES, "num_buckets": NUM_BUCKETS, "chunk_length": 4, "num_chunks_after": 1,
           "seed": hash_seed}
    return ReformerBackbone(
        vocabulary_size=32, hidden_dim=8, num_heads=HEADS, head_dim=HEAD_DIM, intermediate_dim=16,
        attention=["lsh", "local", "lsh"], is_causal=False, attention_options={"lsh": lsh, "local": {"block_size": 4}},
        axial_pos_shape=(4, 4), axial_pos_embds_dim=(4, 4), dropout=0.0, attention_dropout=0.0,
    )


def _output(backbone):
    ids = np.arange(2, 18, dtype="int32").reshape(1, 16) % 32
    outputs = backbone({"token_ids": ids, "padding_mask": np.ones_like(ids)})
    return np.asarray(keras.ops.convert_to_numpy(outputs["sequence_output"]))


@pytest.fixture(scope="module")
def backbones():
    first, second = _backbone(hash_seed=1), _backbone(hash_seed=2)
    second.set_weights(first.get_weights())
    return first, second


def test_the_shape_is_the_mechanisms(backbones):
    first, _ = backbones
    expected = lsh_rotations_shape(HEADS, HEAD_DIM, NUM_HASHES, NUM_BUCKETS)
    assert first.lsh_rotations_shape == expected
    assert all(branch.rotations_shape == expected for branch in first.attention_branches if branch.attention == "lsh")


def test_set_rotations_decide_the_hashing_and_none_restores_the_seed(backbones):
    first, second = backbones
    seeded = _output(first), _output(second)
    assert not np.allclose(*seeded, atol=1e-4)  # two hash seeds hash differently

    rotations = np.random.default_rng(7).standard_normal(first.lsh_rotations_shape).astype("float32")
    for backbone in backbones:
        backbone.set_lsh_rotations(rotations)
    assert all(
        branch.rotations is None or np.array_equal(branch.rotations, rotations)
        for branch in first.attention_branches
    )
    np.testing.assert_allclose(_output(first), _output(second), atol=1e-6)

    for backbone, before in zip(backbones, seeded):
        backbone.set_lsh_rotations(None)
        np.testing.assert_allclose(_output(backbone), before, atol=1e-6)


def test_a_branch_takes_rotations_on_its_own(backbones):
    first, _ = backbones
    branch = next(branch for branch in first.attention_branches if branch.attention == "lsh")
    rotations = np.ones(branch.rotations_shape, "float32")
    branch.set_rotations(rotations)
    try:
        np.testing.assert_array_equal(branch.rotations, rotations)
    finally:
        branch.set_rotations(None)
    assert branch.rotations is None
