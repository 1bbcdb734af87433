"""Each row's key length beside the mask (`backend_support.fused_dot_product_attention`):
under JAX on a GPU cuDNN is told where a row's last visible key is, and
skips the keys after it. The lengths against a numpy reading of the mask;
the attention with them against the masked attention without them (JAX's
XLA form here, cuDNN's too where a GPU runs the tests); and the dispatch,
made to happen on a CPU by standing in XLA's form for cuDNN's."""

import keras
import numpy as np
import pytest

import attention_zoo_keras as azk
from attention_zoo_keras.backend_support import attention_kernels
from tests.support.tiny_models import tiny_gpt

JAX = keras.backend.backend() == "jax"
# A right-padded batch of two for the generation tests (0: padding).
PADDED_IDS = np.array([[5, 6, 7, 8, 0, 0], [3, 4, 5, 6, 7, 8]], "int32")


def _masks(rng, batch, queries, keys):
    """Boolean `(batch, 1, queries, keys)` masks of every shape the library
    makes: right-padded, left-padded, with holes, causal with padding, a
    row that sees nothing, and broadcast ones."""
    right = np.arange(keys) < rng.integers(1, keys + 1, size=(batch, 1))
    left = np.arange(keys) >= rng.integers(0, keys, size=(batch, 1))
    holes = rng.random((batch, keys)) < 0.5
    holes[0] = False
    causal = np.tril(np.ones((queries, keys), bool), keys - queries)
    return {
        "right-padded": right[:, None, None, :],
        "left-padded": left[:, None, None, :],
        "holes, a row that sees nothing": holes[:, None, None, :],
        "causal and right-padded": np.logical_and(right[:, None, None, :], causal),
        "per query": rng.random((batch, 1, queries, keys)) < 0.3,
        "one row for the batch": right[:1, None, None, :],
        "keys only": right[0],
    }


def _expected_lengths(mask, batch, keys):
    mask = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
    mask = np.broadcast_to(mask, (batch,) + mask.shape[1:])
    visible = mask.any(axis=(1, 2))
    return np.array([np.flatnonzero(row).max() + 1 if row.any() else keys for row in visible])


def test_key_lengths_are_one_past_the_last_visible_key():
    rng = np.random.default_rng(0)
    for name, mask in _masks(rng, batch=4, queries=3, keys=7).items():
        got = keras.ops.convert_to_numpy(attention_kernels.key_lengths(mask, batch_size=4, key_length=7))
        np.testing.assert_array_equal(got, _expected_lengths(mask, 4, 7), err_msg=name)
        assert got.dtype == np.int32


def _implementations():
    if not JAX:
        return []
    from attention_zoo_keras.backend_support.environment import jax_compiles_for_gpu

    return ["xla"] + (["cudnn"] if jax_compiles_for_gpu() else [])


@pytest.mark.skipif(not JAX, reason="JAX's dot_product_attention takes the key lengths")
@pytest.mark.parametrize("implementation", _implementations())
def test_attention_with_key_lengths_is_the_masked_attention(implementation):
    """Every key past a row's length has zero weight under the mask, so
    bounding the keys changes nothing: any mask, left-padded too."""
    rng = np.random.default_rng(1)
    batch, queries, keys, heads, depth = 4, 6, 8, 2, 16
    dtype, tolerance = ("bfloat16", 2e-2) if implementation == "cudnn" else ("float32", 1e-6)
    query, key, value = (
        keras.ops.cast(rng.standard_normal((batch, length, heads, depth)), dtype)
        for length in (queries, keys, keys)
    )
    for name, mask in _masks(rng, batch, queries, keys).items():
        mask = np.broadcast_to(mask, mask.shape[:-2] + (queries, keys))  # as mask_for_fused_attention shapes it
        expected = keras.ops.dot_product_attention(query, key, value, mask=mask, scale=0.25)
        got = attention_kernels.attention_with_key_lengths(query, key, value, mask, 0.25, implementation)
        np.testing.assert_allclose(
            keras.ops.convert_to_numpy(keras.ops.cast(got, "float32")),
            keras.ops.convert_to_numpy(keras.ops.cast(expected, "float32")),
            atol=tolerance,
            err_msg=name,
        )


@pytest.fixture
def key_lengths_on_a_cpu(monkeypatch):
    """Where no GPU runs the tests, the library is made to take its GPU
    path, with JAX's XLA form of attention with key lengths in place of
    cuDNN's; what the path asked for is recorded: the implementation, and
    whether the lengths came with the mask or alone. On a GPU nothing is
    replaced (cuDNN runs) and nothing recorded: `None`."""
    from attention_zoo_keras.backend_support.environment import jax_compiles_for_gpu

    if jax_compiles_for_gpu():
        return None
    asked_for = []
    with_key_lengths = attention_kernels.attention_with_key_lengths

    def on_a_cpu(query, key, value, mask, scale, implementation, lengths=None):
        asked_for.append(f"{implementation}, {'mask' if lengths is None else 'lengths alone'}")
        return with_key_lengths(query, key, value, mask, scale, "xla", lengths=lengths)

    monkeypatch.setattr(attention_kernels, "jax_compiles_for_gpu", lambda: True)
    monkeypatch.setattr(attention_kernels, "attention_with_key_lengths", on_a_cpu)
    return asked_for


def _with_and_without_key_lengths(monkeypatch, compute):
    with_lengths = compute()
    monkeypatch.setattr(attention_kernels, "_KEY_LENGTHS_FOR_CUDNN", False)
    return with_lengths, compute()


@pytest.mark.skipif(not JAX, reason="the key lengths are given to JAX's cuDNN attention")
def test_a_half_precision_bert_with_key_lengths_computes_what_it_computes_without(key_lengths_on_a_cpu, monkeypatch):
    """A right-padded bfloat16 batch through two layers: every layer's
    attention takes the key lengths alone (the blocks see the padding last,
    `layers.padding_last`), and the unpadded positions' outputs are those of
    the mask alone."""
    keras.utils.set_random_seed(0)
    backbone = azk.models.BertBackbone(
        vocabulary_size=30, num_layers=2, num_heads=2, hidden_dim=16, intermediate_dim=32, max_sequence_length=16,
        dtype="bfloat16",
    )
    lengths = np.array([8, 3, 5])
    inputs = {
        "token_ids": np.random.default_rng(0).integers(1, 30, (3, 8)).astype("int32"),
        "segment_ids": np.zeros((3, 8), "int32"),
        "padding_mask": np.arange(8) < lengths[:, None],
    }

    def compute():
        outputs = backbone(inputs, training=False)
        return keras.ops.convert_to_numpy(keras.ops.cast(outputs["sequence_output"], "float32"))

    with_lengths, without = _with_and_without_key_lengths(monkeypatch, compute)
    # On a CPU the two are one XLA program with and without a redundant mask
    # (equal; one bfloat16 step at 1 is 8e-3); on a GPU, cuDNN's kernel with
    # and without skipping blocks.
    tolerance = 1e-3 if key_lengths_on_a_cpu is not None else 1e-2
    if key_lengths_on_a_cpu is not None:
        assert key_lengths_on_a_cpu == ["cudnn, lengths alone"] * 2, "each layer asked cuDNN for key lengths"
    for row, length in enumerate(lengths):
        np.testing.assert_allclose(with_lengths[row, :length], without[row, :length], atol=tolerance)


@pytest.mark.skipif(not JAX, reason="the key lengths are given to JAX's cuDNN attention")
def test_float32_attention_is_left_to_keras(key_lengths_on_a_cpu):
    """cuDNN's fused attention takes half precision only: in float32 no key
    lengths are asked for (checked where the path is made to run on a CPU)."""
    mask = np.ones((2, 1, 4, 4), bool)
    query = np.ones((2, 4, 2, 8), "float32")
    azk.attention.softmax_attention(query, query, query, attention_mask=mask)
    assert key_lengths_on_a_cpu in ([], None)


@pytest.mark.skipif(not JAX, reason="the key lengths are given to JAX's cuDNN attention")
def test_half_precision_generation_with_key_lengths_gives_the_same_tokens(key_lengths_on_a_cpu, monkeypatch):
    """Decoding steps attend over a cache of which only the written part
    is visible: the key length stops there. A padded batch of two."""
    prompt = {"token_ids": PADDED_IDS, "padding_mask": PADDED_IDS > 0}

    def generated():
        keras.utils.set_random_seed(0)
        lm = azk.models.GPTCausalLM(
            tiny_gpt(vocabulary_size=97, max_sequence_length=32, hidden_dim=16, dtype="bfloat16"), preprocessor=None
        )
        return lm.generate(prompt, max_length=20, stop_token_ids=None, return_scores=True)

    with_lengths, without = _with_and_without_key_lengths(monkeypatch, generated)
    if key_lengths_on_a_cpu is not None:
        assert key_lengths_on_a_cpu and set(key_lengths_on_a_cpu) == {"cudnn, mask"}
    np.testing.assert_array_equal(with_lengths["token_ids"], without["token_ids"])
    tolerance = 1e-4 if key_lengths_on_a_cpu is not None else 1e-2  # (see the BERT test)
    np.testing.assert_allclose(with_lengths["scores"], without["scores"], atol=tolerance)


@pytest.mark.skipif(not JAX, reason="the key lengths are given to JAX's cuDNN attention")
def test_half_precision_translation_with_key_lengths_gives_the_same_tokens(key_lengths_on_a_cpu, monkeypatch):
    """The seq2seq model under JAX: its encoder attends by key lengths
    alone (padding moved last), and so does the cross-attention of every
    decoding step (the sources are right-padded); the self-attention over
    the cache by the mask and lengths. Beam search, a padded batch of two."""
    sources = {"encoder_token_ids": PADDED_IDS, "encoder_padding_mask": PADDED_IDS > 0}

    def generated():
        keras.utils.set_random_seed(0)
        backbone = azk.models.TransformerBackbone(
            vocabulary_size=97, num_encoder_layers=1, num_decoder_layers=2, num_heads=2, hidden_dim=16,
            intermediate_dim=32, max_sequence_length=32, dtype="bfloat16",
        )
        lm = azk.models.TransformerSeq2SeqLM(backbone)
        return lm.generate(sources, max_length=8, num_beams=2, stop_token_ids=None, decoder_start_token_id=1)

    with_lengths, without = _with_and_without_key_lengths(monkeypatch, generated)
    if key_lengths_on_a_cpu is not None:
        assert set(key_lengths_on_a_cpu) == {"cudnn, lengths alone", "cudnn, mask"}
        # The encoder's layer, and the two decoder layers' cross-attention: lengths alone.
        assert key_lengths_on_a_cpu.count("cudnn, lengths alone") >= 3
    np.testing.assert_array_equal(with_lengths["token_ids"], without["token_ids"])
