"""The encoder block against `torch.nn.TransformerEncoderLayer` (post- and pre-norm)."""

import keras
import numpy as np
import pytest
import torch

from attention_zoo_keras.layers import MultiHeadAttention
from attention_zoo_keras.layers import TransformerEncoderBlock

HIDDEN, HEADS, FFN = 16, 4, 32


def load_from_torch(block, reference):
    """Copies a torch TransformerEncoderLayer's weights into our block."""
    in_weight = reference.self_attn.in_proj_weight.detach().numpy()
    in_bias = reference.self_attn.in_proj_bias.detach().numpy()
    attention_layer = block.self_attention
    for index, dense in enumerate((attention_layer.query_dense, attention_layer.key_dense, attention_layer.value_dense)):
        rows = slice(index * HIDDEN, (index + 1) * HIDDEN)
        dense.kernel.assign(in_weight[rows].T)
        dense.bias.assign(in_bias[rows])
    attention_layer.output_dense.kernel.assign(reference.self_attn.out_proj.weight.detach().numpy().T)
    attention_layer.output_dense.bias.assign(reference.self_attn.out_proj.bias.detach().numpy())
    block.feed_forward.intermediate_dense.kernel.assign(reference.linear1.weight.detach().numpy().T)
    block.feed_forward.intermediate_dense.bias.assign(reference.linear1.bias.detach().numpy())
    block.feed_forward.output_dense.kernel.assign(reference.linear2.weight.detach().numpy().T)
    block.feed_forward.output_dense.bias.assign(reference.linear2.bias.detach().numpy())
    for ours, theirs in ((block.attention_norm, reference.norm1), (block.output_norm, reference.norm2)):
        ours.gamma.assign(theirs.weight.detach().numpy())
        ours.beta.assign(theirs.bias.detach().numpy())


@pytest.mark.parametrize("norm_first", [False, True])
def test_matches_torch_encoder_layer(norm_first):
    torch.manual_seed(0)
    reference = torch.nn.TransformerEncoderLayer(
        HIDDEN, HEADS, FFN, dropout=0.0, activation="gelu", batch_first=True, norm_first=norm_first, layer_norm_eps=1e-5
    ).eval()
    with torch.no_grad():
        for parameter in reference.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    block = TransformerEncoderBlock(HEADS, FFN, activation="gelu", layer_norm_epsilon=1e-5, norm_first=norm_first)
    block.build((None, None, HIDDEN))
    load_from_torch(block, reference)

    x = np.random.default_rng(0).standard_normal((2, 6, HIDDEN)).astype("float32")
    padding = np.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]], bool)
    ours = block(x, attention_mask=padding[:, None, :])
    with torch.no_grad():
        theirs = reference(torch.from_numpy(x), src_key_padding_mask=torch.from_numpy(~padding))
    # torch zeroes nothing at padded query positions; compare every position.
    np.testing.assert_allclose(keras.ops.convert_to_numpy(ours), theirs.numpy(), atol=1e-5)


def test_causal_block_ignores_the_future():
    block = TransformerEncoderBlock(2, 8, is_causal=True)
    x = np.random.default_rng(1).standard_normal((1, 5, 8)).astype("float32")
    changed = x.copy()
    changed[:, 3:] += 10.0
    a = keras.ops.convert_to_numpy(block(x))
    b = keras.ops.convert_to_numpy(block(changed))
    np.testing.assert_allclose(a[:, :3], b[:, :3], atol=1e-5)
    assert not np.allclose(a[:, 3:], b[:, 3:])


def test_config_round_trip():
    block = TransformerEncoderBlock(2, 8, norm_first=True, attention="softmax", name="b")
    rebuilt = TransformerEncoderBlock.from_config(block.get_config())
    assert rebuilt.get_config() == block.get_config()


def test_multi_head_attention_cross_attention_shapes():
    layer = MultiHeadAttention(num_heads=2, head_dim=3, output_dim=5)
    out = layer(np.zeros((2, 4, 6), "float32"), np.zeros((2, 7, 6), "float32"))
    assert tuple(out.shape) == (2, 4, 5)


def test_unknown_mechanism_is_rejected_at_construction():
    with pytest.raises(ValueError, match="Unknown attention mechanism"):
        MultiHeadAttention(num_heads=2, head_dim=4, attention="nope")


@pytest.mark.parametrize("norm_first", [False, True])
def test_bfloat16_block_computes_in_bfloat16(norm_first):
    block = TransformerEncoderBlock(2, 16, norm_first=norm_first, dropout=0.1, dtype="bfloat16")
    out = block(np.ones((1, 3, 8), "float32"), attention_mask=np.ones((1, 1, 3), bool))
    assert keras.backend.standardize_dtype(out.dtype) == "bfloat16"
