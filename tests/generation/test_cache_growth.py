"""A decoding cache that grows with the positions written
(`generation.cache_growth`): on a CPU the loop runs in segments of growing
cache sizes (under JAX and TensorFlow, one loop per size in the one
compiled program), and gives the tokens and scores of a cache that keeps
the buffer's size; on a GPU the cache keeps one size."""

import keras
import numpy as np
import pytest

import attention_zoo_keras as azk
from attention_zoo_keras.attention import KeyValueCache
from attention_zoo_keras.attention.registry import get_decoding
from attention_zoo_keras.backend_support import compiled_decoding
from attention_zoo_keras.backend_support import decoding_cache_sizes
from attention_zoo_keras.generation import cache_growth
from attention_zoo_keras.models import causal_lm
from tests.support.streamers import RecordingStreamer
from tests.support.tiny_models import tiny_gpt

TORCH = keras.backend.backend() == "torch"


def _on_cpu():
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        return jax.default_backend() == "cpu"
    if backend == "tensorflow":
        import tensorflow as tf

        return not tf.config.list_logical_devices("GPU")
    return not keras.ops.convert_to_tensor(0).is_cuda


GROWS = _on_cpu()
NOT_GROWING = "the cache grows only on a CPU; on a GPU it keeps one size"


def test_a_key_value_cache_resized_keeps_its_positions_and_empties_new_slots():
    decoding = get_decoding("softmax")
    rng = np.random.default_rng(0)
    keys, values = (rng.normal(size=(2, 8, 2, 4)).astype("float32") for _ in range(2))
    cache = (keras.ops.convert_to_tensor(keys), keras.ops.convert_to_tensor(values))

    shrunk = decoding.resized(cache, 5)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(shrunk[0]), keys[:, :5])
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(shrunk[1]), values[:, :5])

    grown = decoding.resized(shrunk, 12)
    for tensor, original in zip(grown, (keys, values)):
        tensor = keras.ops.convert_to_numpy(tensor)
        assert tensor.shape == (2, 12, 2, 4)
        np.testing.assert_array_equal(tensor[:, :5], original[:, :5])
        np.testing.assert_array_equal(tensor[:, 5:], 0.0)

    assert decoding.resized(cache, 8) is cache


@pytest.mark.parametrize("attention", ["linear", "lsh"])
def test_a_cache_that_cannot_change_size_says_so(attention):
    decoding = get_decoding(attention)
    assert not decoding.resizable
    with pytest.raises(NotImplementedError, match=type(decoding).__name__):
        decoding.resized((), 8)


def test_which_tasks_grow_their_cache():
    assert isinstance(get_decoding("relative"), KeyValueCache) and get_decoding("relative").resizable
    softmax_lm = azk.models.GPTCausalLM(tiny_gpt(), preprocessor=None)
    linear_lm = azk.models.GPTCausalLM(tiny_gpt(attention="linear", attention_dropout=0.0), preprocessor=None)
    translator = azk.models.TransformerSeq2SeqLM(azk.models.TransformerBackbone(
        vocabulary_size=30, num_encoder_layers=1, num_decoder_layers=2, num_heads=2, hidden_dim=8,
        intermediate_dim=16, max_sequence_length=16,
    ))
    transformer_xl = azk.models.TransformerXLCausalLM(azk.models.TransformerXLBackbone(
        vocabulary_size=40, num_layers=1, num_heads=2, hidden_dim=8, head_dim=4, intermediate_dim=16, mem_len=8,
    ))
    assert softmax_lm._cache_growth() is not None
    assert linear_lm._cache_growth() is None  # a recurrent state has no positions
    assert transformer_xl._cache_growth() is None  # its position keys are laid out for the buffer

    growth = translator._cache_growth()
    cache = translator.backbone.decoder_layers[0].self_attention.initial_cache(3, 16)
    resized = growth.resize((cache, cache), 4)
    assert [tuple(tensor.shape) for layer in resized for tensor in layer] == [(3, 4, 2, 4)] * 4
    # A step reads the decoder's weights and the output matrix (the shared embedding), not the encoder's.
    decoder_weights = sum(int(np.prod(v.shape)) for block in translator.backbone.decoder_layers for v in block.weights)
    assert growth.weight_bytes == 4 * (decoder_weights + 30 * 8)


def test_the_cache_sizes_of_a_loop():
    def sizes(buffer_length, first_position, cache_traffic=2**30, weight_bytes=2**30):
        ids = keras.ops.zeros((1, buffer_length), "int32")
        return decoding_cache_sizes(ids, first_position, cache_traffic, weight_bytes)

    if GROWS:
        assert sizes(192, 32) == (64, 128, 192)
        assert sizes(192, 0) == (16, 32, 64, 128, 192)
        assert sizes(64, 16) == (32, 64)
        assert sizes(64, 40) == (64,)
        assert sizes(16, 3) == (16,)
        # The cache moves too little beside the weights, or too little at all, to pay for recordings.
        assert sizes(192, 32, cache_traffic=0.4 * 2**30) == (192,)
        assert sizes(192, 32, cache_traffic=2**20, weight_bytes=2**10) == (192,)
        assert sizes(192, 32, cache_traffic=8 * 2**20, weight_bytes=2**10) == (64, 128, 192)
    else:
        assert sizes(192, 32) == (192,)
        assert sizes(16, 3) == (16,)


def test_the_cache_traffic_of_a_step_counts_its_passes_over_the_cache(monkeypatch):
    weighed = []
    monkeypatch.setattr(
        cache_growth, "decoding_cache_sizes", lambda ids, first, traffic, weights: weighed.append((traffic, weights))
    )
    growth = cache_growth.CacheGrowth(resize=None, weight_bytes=1000)
    cache = ((keras.ops.zeros((2, 8, 2, 4)), keras.ops.zeros((2, 8, 2, 4), "bfloat16")),)
    cache_growth.cache_sizes(keras.ops.zeros((2, 8), "int32"), 1, cache, 3, growth)
    assert weighed == [(3 * (2 * 8 * 2 * 4) * (4 + 2), 1000)]


def _gpt():
    keras.utils.set_random_seed(0)
    lm = azk.models.GPTCausalLM(tiny_gpt(vocabulary_size=97, max_sequence_length=32), preprocessor=None)
    prompts = {
        "token_ids": np.array([[5, 6, 7, 0, 0], [9, 3, 2, 1, 4]], "int32"),
        "padding_mask": np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool),
    }
    return lm, prompts, {"max_length": 30, "stop_token_ids": None}


def _translator():
    keras.utils.set_random_seed(0)
    backbone = azk.models.TransformerBackbone(
        vocabulary_size=30, num_encoder_layers=1, num_decoder_layers=2, num_heads=2, hidden_dim=8,
        intermediate_dim=16, max_sequence_length=32, dropout=0.0, attention_dropout=0.0,
    )
    sources = {
        "encoder_token_ids": np.array([[3, 4, 5, 6, 7], [8, 9, 2, 0, 0]], "int32"),
        "encoder_padding_mask": np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], "int32"),
    }
    return azk.models.TransformerSeq2SeqLM(backbone), sources, {
        "max_length": 30, "decoder_start_token_id": 1, "stop_token_ids": None
    }


def _grow_from_4_recording_sizes(monkeypatch):
    """Makes every cache grow, from 4 slots (16 by default), and returns the list
    that every `KeyValueCache.resized` call appends its size to."""
    monkeypatch.setattr(compiled_decoding, "_SMALLEST_GROWN_CACHE", 4)
    monkeypatch.setattr(compiled_decoding, "_GROWTH_PAYS_FROM_SHARE", 0.0)
    monkeypatch.setattr(compiled_decoding, "_GROWTH_PAYS_FROM_BYTES", 0)
    sizes = []
    resized = KeyValueCache.resized

    def recorded(self, cache, max_length):
        sizes.append(max_length)
        return resized(self, cache, max_length)

    monkeypatch.setattr(KeyValueCache, "resized", recorded)
    return sizes


@pytest.mark.skipif(not GROWS, reason=NOT_GROWING)
@pytest.mark.parametrize("task", [_gpt, _translator], ids=["gpt", "seq2seq"])
@pytest.mark.parametrize(
    "decoding",
    [{"sampler": "greedy"}, {"sampler": "top_k", "k": 5, "seed": 3}, {"num_beams": 3, "length_penalty": 0.6}],
    ids=["greedy", "top_k", "beam"],
)
def test_a_growing_cache_gives_the_tokens_and_scores_of_one_size(monkeypatch, task, decoding):
    model, inputs, options = task()
    monkeypatch.setattr(causal_lm, "PROMPT_MULTIPLE", 1)  # the prompt pass covers the prompt alone
    sizes = _grow_from_4_recording_sizes(monkeypatch)
    grown = model.generate(inputs, return_scores=True, **options, **decoding)
    # Sizes above the first position the loop decodes, as far as the program
    # knows it when it is built: one past the prompt pass (the shortest
    # prompt, 3 tokens), or the decoder start token.
    first_position = 4 if task is _gpt else 1
    assert sorted(set(sizes)) == [size for size in (4, 8, 16) if size > first_position] + [32]

    monkeypatch.setattr(compiled_decoding, "_grows_decoding_caches", lambda token_ids: False)
    model._forget_compiled_functions()  # (JAX, TensorFlow: the grown program would be reused)
    del sizes[:]
    one_size = model.generate(inputs, return_scores=True, **options, **decoding)
    assert set(sizes) <= {32}
    np.testing.assert_array_equal(grown["token_ids"], one_size["token_ids"])
    np.testing.assert_array_equal(grown["padding_mask"], one_size["padding_mask"])
    np.testing.assert_allclose(grown["scores"], one_size["scores"], atol=1e-5)
    assert grown["token_ids"].shape[1] == 30


@pytest.mark.skipif(not GROWS, reason=NOT_GROWING)
def test_a_stream_grows_its_cache_chunk_by_chunk(monkeypatch):
    lm, _, _ = _gpt()
    prompt = {"token_ids": np.array([[5, 6, 7]], "int32"), "padding_mask": np.ones((1, 3), "int32")}
    sizes = _grow_from_4_recording_sizes(monkeypatch)
    streamer = RecordingStreamer()
    lm.generate(prompt, max_length=30, stop_token_ids=None, streamer=streamer)
    # Chunks end at 4, 6, 10, 18 and 32, the buffer's end (`chunk_ends`); each
    # runs with the smallest size that holds the positions it feeds.
    assert sizes == [4, 8, 16, 32, 32]

    monkeypatch.setattr(compiled_decoding, "_grows_decoding_caches", lambda token_ids: False)
    one_size = lm.generate(prompt, max_length=30, stop_token_ids=None)
    assert sum(streamer.puts, []) == one_size["token_ids"][0].tolist()


@pytest.mark.skipif(not TORCH, reason="torch compiles loop bodies apart under jit_compile=True; JAX, TensorFlow: the test below")
def test_jit_compile_keeps_one_cache_size():
    """Under `compile(jit_compile=True)` each size would be one more inductor
    compilation of the loop's body on torch."""
    lm, _, _ = _gpt()
    assert lm._loop_cache_growth() is not None
    lm.compile(jit_compile=True)
    assert lm._loop_cache_growth() is None


@pytest.mark.skipif(TORCH or not GROWS, reason="JAX and TensorFlow compile each decoding loop whole (torch: above)")
def test_the_loops_of_every_cache_size_compile_into_one_program(monkeypatch):
    model, inputs, options = _translator()
    sizes = _grow_from_4_recording_sizes(monkeypatch)
    starts = []
    start_decoding = type(model)._start_decoding
    monkeypatch.setattr(
        type(model), "_start_decoding", lambda self, *args: starts.append(1) or start_decoding(self, *args)
    )
    assert model._loop_cache_growth() is not None  # JAX too, whose jit_compile is always True
    assert model.jit_compile is True or keras.backend.backend() != "jax"
    results = [model.generate(inputs, num_beams=3, **options)["token_ids"] for _ in range(3)]
    assert len(starts) == 1  # traced once: one program for the three calls
    assert sorted(set(sizes)) == [4, 8, 16, 32]  # with a loop per size
    for tokens in results[1:]:
        np.testing.assert_array_equal(tokens, results[0])
