"""`block_stack`: numbered blocks, each with its own initializer copy."""

import keras
import numpy as np

from attention_zoo_keras.layers.block_stack import block_stack
from attention_zoo_keras.layers.transformer_decoder_block import TransformerDecoderBlock
from attention_zoo_keras.layers.transformer_encoder_block import TransformerEncoderBlock


def test_blocks_are_numbered_from_zero_under_the_prefix():
    blocks = block_stack(
        TransformerDecoderBlock, 3, "glorot_uniform", name="decoder_layer", num_heads=2, intermediate_dim=8
    )
    assert [block.name for block in blocks] == ["decoder_layer_0", "decoder_layer_1", "decoder_layer_2"]
    assert all(isinstance(block, TransformerDecoderBlock) for block in blocks)


def test_every_block_gets_the_arguments_and_its_own_initializer():
    initializer = keras.initializers.TruncatedNormal(stddev=0.02)
    blocks = block_stack(
        TransformerEncoderBlock, 2, initializer, num_heads=2, intermediate_dim=8, norm_first=True, dtype="float16"
    )
    assert all(block.norm_first and block.intermediate_dim == 8 for block in blocks)
    assert all(block.dtype_policy.name == "float16" for block in blocks)
    initializers = [block.kernel_initializer for block in blocks]
    assert initializers[0] is not initializers[1] and initializer not in initializers
    assert all(i.get_config()["stddev"] == 0.02 for i in initializers)


def test_no_blocks():
    assert block_stack(TransformerEncoderBlock, 0, "glorot_uniform", num_heads=2, intermediate_dim=8) == []


def test_the_stack_runs_in_order():
    blocks = block_stack(TransformerEncoderBlock, 2, "glorot_uniform", num_heads=2, intermediate_dim=8)
    x = np.random.default_rng(0).normal(size=(1, 3, 4)).astype("float32")
    y = x
    for block in blocks:
        y = block(y)
    assert y.shape == x.shape
