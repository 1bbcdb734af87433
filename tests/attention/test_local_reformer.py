"""The Reformer's local attention (Kitaev et al., 2020) against transformers'
`LocalSelfAttention`: its query/key/value projections, computed here from
the module's weights, fed to `local_attention`, must give the module's
output (it has no output projection: that is `ReformerSelfOutput`, in
`ReformerAttention`) within 1e-5 at every real (unmasked) position.

The module chunks the sequence into `local_attn_chunk_length` blocks; block
`k` attends to blocks `k − local_num_chunks_before … k +
local_num_chunks_after`, counted *cyclically* (its `_look_adjacent` wraps
round), masks keys with −1e9 (key padding) and, as a decoder, by original
positions (`j ≤ i`). Causal with no look-after blocks this is
`local_attention(block_size=c, num_memory_blocks=before, is_causal=True)`
as it was; otherwise it needs `num_memory_blocks_after=after, cyclic=True`.
"""

import keras
import numpy as np
import pytest

from attention_zoo_keras.attention import local
from attention_zoo_keras.attention.registry import get_decoding
from attention_zoo_keras.attention.registry import mechanism_options
from attention_zoo_keras.layers import MultiHeadAttention

torch = pytest.importorskip("torch")
modeling_reformer = pytest.importorskip("transformers.models.reformer.modeling_reformer")
ReformerConfig = pytest.importorskip("transformers").ReformerConfig

HIDDEN, HEADS, HEAD_DIM = 12, 3, 4


def numpy(x):
    return keras.ops.convert_to_numpy(x)


def reformer_config(chunk, before, after, causal):
    return ReformerConfig(
        hidden_size=HIDDEN,
        num_attention_heads=HEADS,
        attention_head_size=HEAD_DIM,
        attn_layers=["local"],
        local_attn_chunk_length=chunk,
        local_num_chunks_before=before,
        local_num_chunks_after=after,
        is_decoder=causal,
        local_attention_probs_dropout_prob=0.0,
        hidden_dropout_prob=0.0,
    )


def module_and_inputs(config, batch, length, seed):
    torch.manual_seed(seed)
    module = modeling_reformer.LocalSelfAttention(config).eval()
    hidden = np.random.default_rng(seed).standard_normal((batch, length, HIDDEN)).astype("float32")
    return module, hidden


def heads(module, name, hidden):
    """The module's `name` projection of `hidden`, from its weights, as
    `(batch, length, heads, head_dim)`."""
    weight = getattr(module, name).weight.detach().numpy()  # (out, in), no bias
    return (hidden @ weight.T).reshape(hidden.shape[:2] + (HEADS, HEAD_DIM))


def module_output(module, hidden, padding_mask):
    mask = None if padding_mask is None else torch.tensor(padding_mask.astype("int64"))
    with torch.no_grad():
        out = module(torch.tensor(hidden), attention_mask=mask).hidden_states.numpy()
    return out.reshape(hidden.shape[:2] + (HEADS, HEAD_DIM))


def padding(batch, length, seed):
    """A key-padding mask: the last sequence padded at the end, another with
    a hole in the middle."""
    mask = np.ones((batch, length), bool)
    mask[-1, length - length // 3 :] = False
    if batch > 2:
        mask[1, [1, length // 2]] = False
    return mask


def ours(module, hidden, padding_mask, chunk, before, after, causal, **options):
    q, k, v = (heads(module, name, hidden) for name in ("query", "key", "value"))
    mask = None if padding_mask is None else padding_mask[:, None, None, :]
    return numpy(
        local.local_attention(
            q, k, v, attention_mask=mask, is_causal=causal, block_size=chunk, num_memory_blocks=before,
            num_memory_blocks_after=after, cyclic=True, **options,
        )
    )


def assert_real_positions_match(got, expected, padding_mask, atol=1e-5):
    """Compared at the real tokens: a padded query's output is unspecified
    (transformers gives a fully masked row a uniform average over its
    window, −1e9 on every key; here it is what softmax gives)."""
    real = np.ones(got.shape[:2], bool) if padding_mask is None else padding_mask
    np.testing.assert_allclose(got[real], expected[real], atol=atol)


# (chunk, before, after, length): several blocks; one block (transformers'
# plain attention for length ≤ chunk); two blocks with a window of three
# (transformers' window then holds the other block twice).
GEOMETRIES = [
    (4, 1, 0, 12),
    (4, 1, 0, 4),
    (4, 1, 0, 3),
    (3, 2, 0, 15),
    (4, 1, 1, 12),
    (2, 0, 1, 8),
    (4, 1, 1, 8),
    (3, 0, 0, 9),
]


@pytest.mark.parametrize("masked", [False, True], ids=["no_mask", "padding_mask"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("chunk,before,after,length", GEOMETRIES)
def test_matches_local_self_attention(chunk, before, after, length, causal, masked):
    batch = 3
    config = reformer_config(chunk, before, after, causal)
    module, hidden = module_and_inputs(config, batch, length, seed=length + chunk)
    padding_mask = padding(batch, length, seed=0) if masked else None
    expected = module_output(module, hidden, padding_mask)
    got = ours(module, hidden, padding_mask, chunk, before, after, causal)
    assert_real_positions_match(got, expected, padding_mask)


@pytest.mark.parametrize("masked", [False, True], ids=["no_mask", "padding_mask"])
def test_causal_default_options_already_match(masked):
    """The Reformer's language-model setting (decoder, one chunk before,
    none after) is the zoo's causal local attention as it was: no wrap-round
    is visible under causality."""
    chunk, length, batch = 4, 16, 3
    module, hidden = module_and_inputs(reformer_config(chunk, 1, 0, True), batch, length, seed=5)
    padding_mask = padding(batch, length, seed=1) if masked else None
    q, k, v = (heads(module, name, hidden) for name in ("query", "key", "value"))
    mask = None if padding_mask is None else padding_mask[:, None, None, :]
    got = numpy(
        local.local_attention(q, k, v, attention_mask=mask, is_causal=True, block_size=chunk, num_memory_blocks=1)
    )
    assert_real_positions_match(got, module_output(module, hidden, padding_mask), padding_mask)


def test_bidirectional_needs_the_wrap_round():
    """Without `cyclic` the first block does not see the last one, and
    transformers' first block does (its `_look_adjacent` wraps)."""
    chunk, length = 4, 12
    module, hidden = module_and_inputs(reformer_config(chunk, 1, 0, False), 2, length, seed=3)
    expected = module_output(module, hidden, None)
    q, k, v = (heads(module, name, hidden) for name in ("query", "key", "value"))
    plain = numpy(local.local_attention(q, k, v, block_size=chunk, num_memory_blocks=1, num_memory_blocks_after=0))
    np.testing.assert_allclose(plain[:, chunk:], expected[:, chunk:], atol=1e-5)  # later blocks agree
    assert np.abs(plain[:, :chunk] - expected[:, :chunk]).max() > 1e-2  # the first does not


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_length_not_a_multiple_of_the_chunk(causal):
    """transformers' `ReformerModel` pads the input to a whole number of
    chunks and masks the padding; `local_attention` pads internally."""
    chunk, length, padded_length = 4, 10, 12
    module, hidden = module_and_inputs(reformer_config(chunk, 1, 0, causal), 2, padded_length, seed=7)
    padding_mask = np.arange(padded_length)[None, :].repeat(2, 0) < length
    expected = module_output(module, hidden, padding_mask)[:, :length]
    got = ours(module, hidden[:, :length], None, chunk, 1, 0, causal)
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_multi_head_attention_matches_the_attention_sublayer():
    """`MultiHeadAttention(use_bias=False, attention="local")` with the
    Reformer options, loaded with `LocalSelfAttention`'s projections and
    `ReformerSelfOutput.dense`, is transformers' attention sublayer without
    its layer norm (all four transformers weights are `(out, in)`: the
    Keras kernels are their transposes)."""
    chunk, length, batch = 4, 12, 2
    config = reformer_config(chunk, 1, 0, False)
    torch.manual_seed(11)
    attention = modeling_reformer.ReformerAttention(config).eval()
    hidden = np.random.default_rng(11).standard_normal((batch, length, HIDDEN)).astype("float32")
    padding_mask = padding(batch, length, seed=2)
    with torch.no_grad():
        mask = torch.tensor(padding_mask.astype("int64"))
        inner = attention.self_attention(torch.tensor(hidden), attention_mask=mask)
        expected = attention.output.dense(inner.hidden_states).numpy()
    layer = MultiHeadAttention(
        HEADS, HEAD_DIM, use_bias=False, attention="local",
        attention_options={"block_size": chunk, "num_memory_blocks": 1, "num_memory_blocks_after": 0, "cyclic": True},
    )
    layer.build((batch, length, HIDDEN))
    for dense, module in [
        (layer.query_dense, attention.self_attention.query),
        (layer.key_dense, attention.self_attention.key),
        (layer.value_dense, attention.self_attention.value),
        (layer.output_dense, attention.output.dense),
    ]:
        dense.kernel.assign(module.weight.detach().numpy().T)
    mask = np.broadcast_to(padding_mask[:, None, :], (batch, length, length))
    got = numpy(layer(hidden, attention_mask=mask))
    np.testing.assert_allclose(got[padding_mask], expected[padding_mask], atol=1e-5)


# --- the options themselves -----------------------------------------------


def cyclic_window(length, block, before, after, causal):
    """Query i sees key j iff ⌊j/b⌋ ≡ ⌊i/b⌋ + o (mod ⌈L/b⌉) for some
    −before ≤ o ≤ after, and j ≤ i when causal."""
    num_blocks = -(-length // block)
    mask = np.zeros((length, length), bool)
    for i in range(length):
        for j in range(length):
            near = any((i // block + o - j // block) % num_blocks == 0 for o in range(-before, after + 1))
            mask[i, j] = near and (j <= i or not causal)
    return mask


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("length,block,before,after", [(12, 4, 1, 0), (12, 3, 1, 1), (10, 3, 2, 0), (7, 2, 0, 2)])
def test_cyclic_mask_matches_definition(length, block, before, after, causal):
    got = numpy(local.local_mask(length, block, before, causal, num_memory_blocks_after=after, cyclic=True))
    np.testing.assert_array_equal(got, cyclic_window(length, block, before, after, causal))


def test_asymmetric_window_without_wrap():
    """`num_memory_blocks_after` alone: blocks k − m … k + a, none wrapped."""
    got = numpy(local.local_mask(8, 2, 1, num_memory_blocks_after=0))
    assert set(np.flatnonzero(got[0])) == {0, 1}
    assert set(np.flatnonzero(got[5])) == {2, 3, 4, 5}
    got = numpy(local.local_mask(8, 2, 0, num_memory_blocks_after=2))
    assert set(np.flatnonzero(got[2])) == {2, 3, 4, 5, 6, 7}


def test_defaults_unchanged():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 10, 2, 4)).astype("float32") for _ in range(3))
    for causal in (False, True):
        before = numpy(local.local_attention(q, k, v, is_causal=causal, block_size=3, num_memory_blocks=1))
        after = numpy(
            local.local_attention(
                q, k, v, is_causal=causal, block_size=3, num_memory_blocks=1,
                num_memory_blocks_after=0 if causal else 1, cyclic=False,
            )
        )
        np.testing.assert_array_equal(before, after)


def test_options_are_listed():
    options = mechanism_options("local")
    assert options["num_memory_blocks_after"] is None
    assert options["cyclic"] is False


def test_bad_look_after_is_named():
    q = np.zeros((1, 4, 1, 2), "float32")
    with pytest.raises(ValueError, match=r"num_memory_blocks_after must be None or a non-negative integer; got -1"):
        local.local_attention(q, q, q, block_size=2, num_memory_blocks_after=-1)


def test_decoding_with_the_reformer_options():
    """Causal decoding through the key/value cache equals the causal
    forward pass with the Reformer's options (no look-after blocks)."""
    rng = np.random.default_rng(4)
    batch, length, heads, dim = 2, 9, 2, 4
    q, k, v = (rng.standard_normal((batch, length, heads, dim)).astype("float32") for _ in range(3))
    options = {"block_size": 3, "num_memory_blocks": 1, "num_memory_blocks_after": 0, "cyclic": True}
    expected = numpy(local.local_attention(q, k, v, is_causal=True, **options))
    decoding = get_decoding("local")
    cache = decoding.initial_cache(batch, length + 2, heads, dim, "float32")
    outputs = []
    for position in range(length):
        new = slice(position, position + 1)
        out, cache = decoding.attend_with_cache(q[:, new], k[:, new], v[:, new], cache, position, **options)
        outputs.append(numpy(out))
    np.testing.assert_allclose(np.concatenate(outputs, axis=1), expected, atol=1e-5)


def test_dynamic_length_in_a_tensorflow_graph():
    """With the length unknown while tracing (TensorFlow), the cyclic window
    is built with keras.ops instead of numpy: the same output."""
    if keras.backend.backend() != "tensorflow":
        pytest.skip("a graph with an unknown length is a TensorFlow case")
    import tensorflow as tf

    options = {"block_size": 4, "num_memory_blocks": 1, "num_memory_blocks_after": 0, "cyclic": True}
    spec = tf.TensorSpec((None, None, 2, 4), tf.float32)
    mask_spec = tf.TensorSpec((None, 1, 1, None), tf.bool)

    @tf.function(input_signature=[spec, spec, spec, mask_spec])
    def attend(q, k, v, mask):
        return local.local_attention(q, k, v, attention_mask=mask, **options)

    rng = np.random.default_rng(6)
    for length in (12, 10, 3):
        q, k, v = (rng.standard_normal((2, length, 2, 4)).astype("float32") for _ in range(3))
        mask = np.ones((2, 1, 1, length), bool)
        mask[1, ..., length - 2 :] = False
        expected = numpy(local.local_attention(q, k, v, attention_mask=mask, **options))
        real = mask[:, 0, 0, :]
        np.testing.assert_allclose(numpy(attend(q, k, v, mask))[real], expected[real], atol=1e-5)
