"""TransformerBackbone against `torch.nn.Transformer` with the same weights,
and its decoder's incremental pass against the full one."""

import math

import numpy as np
import pytest
import torch
from keras import ops

from attention_zoo_keras.layers.sinusoidal_position_embedding import sinusoidal_table
from attention_zoo_keras.models.transformer import TransformerBackbone
from attention_zoo_keras.models.transformer.torch_transformer_convert import torch_transformer_arrays
from tests.support.family_tests import run_backbone_test

VOCABULARY, HIDDEN, HEADS, FEED_FORWARD = 40, 16, 4, 32


class TorchTranslator(torch.nn.Module):
    """The reference: a shared embedding scaled by √d, the paper's sinusoids,
    and `torch.nn.Transformer`."""

    def __init__(self, norm_first, activation):
        super().__init__()
        self.embedding = torch.nn.Embedding(VOCABULARY, HIDDEN)
        self.transformer = torch.nn.Transformer(
            HIDDEN, HEADS, num_encoder_layers=2, num_decoder_layers=3, dim_feedforward=FEED_FORWARD,
            dropout=0.0, activation=activation, batch_first=True, norm_first=norm_first,
        )
        self.register_buffer("positions", torch.tensor(sinusoidal_table(np.arange(32), HIDDEN), dtype=torch.float32))

    def embed(self, ids):
        return self.embedding(ids) * math.sqrt(HIDDEN) + self.positions[: ids.shape[1]]

    def forward(self, source, source_mask, target, target_mask):
        memory = self.transformer.encoder(self.embed(source), src_key_padding_mask=~source_mask)
        causal = torch.nn.Transformer.generate_square_subsequent_mask(target.shape[1])
        output = self.transformer.decoder(
            self.embed(target), memory, tgt_mask=causal, tgt_is_causal=True,
            tgt_key_padding_mask=~target_mask, memory_key_padding_mask=~source_mask,
        )
        return memory, output


def _inputs(seed):
    rng = np.random.default_rng(seed)
    source_lengths, target_lengths = [7, 4, 6], [5, 5, 2]
    source = rng.integers(0, VOCABULARY, (3, 7)).astype("int32")
    target = rng.integers(0, VOCABULARY, (3, 5)).astype("int32")
    source_mask = np.arange(7)[None, :] < np.array(source_lengths)[:, None]
    target_mask = np.arange(5)[None, :] < np.array(target_lengths)[:, None]
    return source, source_mask, target, target_mask


@pytest.mark.parametrize("norm_first, activation", [(False, "relu"), (True, "gelu")])
def test_matches_torch_nn_transformer(norm_first, activation):
    torch.manual_seed(0)
    reference = TorchTranslator(norm_first, activation).eval()
    with torch.no_grad():  # move every parameter so no bias is 0 and no norm is the identity
        for parameter in reference.parameters():
            parameter.add_(0.1 * torch.randn(parameter.shape))
    backbone = TransformerBackbone(
        vocabulary_size=VOCABULARY, num_encoder_layers=2, num_decoder_layers=3, num_heads=HEADS,
        hidden_dim=HIDDEN, intermediate_dim=FEED_FORWARD, dropout=0.0, activation=activation,
        max_sequence_length=32, norm_first=norm_first, final_norm=True,
    )
    arrays = torch_transformer_arrays(
        reference.state_dict(), prefix="transformer.", token_embedding=reference.embedding.weight.detach().numpy()
    )
    backbone.assign_arrays(arrays, "torch.nn.Transformer")

    source, source_mask, target, target_mask = _inputs(0)
    with torch.no_grad():
        memory, output = reference(
            torch.tensor(source, dtype=torch.long), torch.tensor(source_mask),
            torch.tensor(target, dtype=torch.long), torch.tensor(target_mask),
        )
    ours = backbone({
        "encoder_token_ids": source, "encoder_padding_mask": source_mask.astype("int32"),
        "decoder_token_ids": target, "decoder_padding_mask": target_mask.astype("int32"),
    })
    encoder_output = ops.convert_to_numpy(ours["encoder_sequence_output"])
    decoder_output = ops.convert_to_numpy(ours["decoder_sequence_output"])
    # Outputs at padding positions are unspecified (torch's fast path zeroes them).
    np.testing.assert_allclose(encoder_output[source_mask], memory.numpy()[source_mask], atol=1e-4)
    np.testing.assert_allclose(decoder_output[target_mask], output.numpy()[target_mask], atol=1e-4)


def test_converter_refuses_a_state_dict_without_a_transformer():
    with pytest.raises(ValueError, match="not a torch.nn.Transformer under the prefix 'model.'"):
        torch_transformer_arrays({"model.linear.weight": np.zeros((2, 2))}, prefix="model.")


@pytest.mark.parametrize("norm_first", [False, True])
def test_incremental_decoding_equals_the_full_decoder(norm_first):
    backbone = TransformerBackbone(
        vocabulary_size=VOCABULARY, num_encoder_layers=1, num_decoder_layers=2, num_heads=HEADS,
        hidden_dim=HIDDEN, intermediate_dim=FEED_FORWARD, dropout=0.0, max_sequence_length=16,
        norm_first=norm_first, position_embedding="sinusoidal_concatenated",
    )
    source, source_mask, target, _ = _inputs(1)
    encoder_mask = source_mask.astype("int32")
    encoder_output = backbone.encode(source, encoder_mask)
    full = ops.convert_to_numpy(backbone.decode(target, None, encoder_output, encoder_mask))

    cache = tuple(block.self_attention.initial_cache(3, 5) for block in backbone.decoder_layers)
    key_values = [block.cross_attention.project_key_value(encoder_output) for block in backbone.decoder_layers]
    prefix, cache = backbone.decode(
        target[:, :2], None, None, encoder_mask, cache=cache, cache_update_index=0, encoder_key_values=key_values
    )
    steps = [ops.convert_to_numpy(prefix)]
    for index in range(2, 5):
        step, cache = backbone.decode(
            target[:, index : index + 1], None, None, encoder_mask, cache=cache, cache_update_index=index,
            encoder_key_values=key_values,
        )
        steps.append(ops.convert_to_numpy(step))
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=1e-5)


def test_mismatched_batches_and_out_of_range_ids_are_named():
    backbone = TransformerBackbone(
        vocabulary_size=VOCABULARY, num_encoder_layers=1, num_decoder_layers=1, num_heads=HEADS,
        hidden_dim=HIDDEN, intermediate_dim=FEED_FORWARD, max_sequence_length=8,
    )
    source, source_mask, target, target_mask = _inputs(2)
    features = {
        "encoder_token_ids": source, "encoder_padding_mask": source_mask.astype("int32"),
        "decoder_token_ids": target[:2], "decoder_padding_mask": target_mask[:2].astype("int32"),
    }
    with pytest.raises(ValueError, match="encoder_token_ids has 3 rows but decoder_token_ids has 2"):
        backbone(features)
    features.update(decoder_token_ids=target + VOCABULARY, decoder_padding_mask=target_mask.astype("int32"))
    with pytest.raises(ValueError, match=r"'decoder_token_ids' holds the id \d+, outside the valid range \[0, 40\)"):
        backbone(features)
    long_source = np.zeros((3, 9), "int32")
    features.update(encoder_token_ids=long_source, encoder_padding_mask=np.ones_like(long_source), decoder_token_ids=target)
    with pytest.raises(ValueError, match="'encoder_token_ids' has length 9, longer than the model's maximum"):
        backbone(features)


def _features(source_length, target_length, batch=2):
    return {
        "encoder_token_ids": np.ones((batch, source_length), "int32"),
        "encoder_padding_mask": np.ones((batch, source_length), "int32"),
        "decoder_token_ids": np.ones((batch, target_length), "int32"),
        "decoder_padding_mask": np.ones((batch, target_length), "int32"),
    }


def test_backbone_behaviour(tmp_path):
    arguments = dict(vocabulary_size=VOCABULARY, num_encoder_layers=1, num_decoder_layers=1, num_heads=2, hidden_dim=8,
                     intermediate_dim=16, max_sequence_length=16)
    run_backbone_test(
        TransformerBackbone, arguments, _features(5, 4), {"encoder_sequence_output": (2, 5, 8),
                                                          "decoder_sequence_output": (2, 4, 8)}, tmp_path,
        variable_input_data=[(_features(7, 3, batch=3), {"encoder_sequence_output": (3, 7, 8),
                                                         "decoder_sequence_output": (3, 3, 8)})],
    )
