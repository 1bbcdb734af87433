"""LSH attention's decoding cache (`LSHDecodingCache`) against Hugging Face
transformers' Reformer generating with `past_buckets_states`.

transformers' side runs `ReformerAttention` (layer norm, `LSHSelfAttention`,
and the caching into a `ReformerDynamicCache`) as `ReformerModel` does while
generating: the prompt, padded with an attention mask where the model would
pad it, then one token at a time with the cache. A forward hook takes
`LSHSelfAttention`'s output (before the output projection); the shared
query/key vectors and the values are the layer-normed hidden states times
its projections. The rotations are reproduced as in `test_lsh.py`
(`hash_seed` set, `torch.manual_seed(seed); torch.randn(shape)`).

Each row is decoded by transformers on its own: with a batch, its cached
step gathers every row's states from row 0 (`_get_relevant_hid_states_and_buckets`
adds a batch offset that is always 0). Our side decodes the rows together.
"""

import keras
import numpy as np
import pytest
from keras import ops

from attention_zoo_keras import backend_support
from attention_zoo_keras.attention.lsh import lsh_rotations_shape
from attention_zoo_keras.attention.lsh_decoding import DECODING_SEED
from attention_zoo_keras.attention.lsh_decoding import LSHDecodingCache
from attention_zoo_keras.attention.registry import get_decoding

BATCH, HEADS, HEAD_DIM, HIDDEN, CHUNK = 2, 2, 8, 16, 4
HASH_SEED = 7


def _numpy(x):
    return np.asarray(keras.ops.convert_to_numpy(x))


def _options(num_hashes, num_buckets, chunks_before, chunks_after):
    return dict(
        num_hashes=num_hashes, num_buckets=num_buckets, chunk_length=CHUNK, num_chunks_before=chunks_before,
        num_chunks_after=chunks_after,
    )


def _transformers_decoding(
    prompt_length, total, num_hashes, num_buckets, chunks_before, chunks_after, padded_to=None, holes=(), seed=0
):
    """transformers decoding positions `prompt_length … total − 1` after a
    prompt of `prompt_length` tokens (padded to `padded_to` with a mask, if
    given; the positions `holes` of the prompt masked as padding too).
    Returns the shared QK and values `(B, max(total, padded_to), N,
    D)`, the rotations, the prompt's output `(B, prompt_length, N, D)` and
    the steps' outputs `(B, total − prompt_length, N, D)`."""
    torch = pytest.importorskip("torch")
    reformer = pytest.importorskip("transformers.models.reformer.modeling_reformer")
    from transformers import ReformerConfig

    config = ReformerConfig(
        hidden_size=HIDDEN, num_attention_heads=HEADS, attention_head_size=HEAD_DIM, attn_layers=["lsh"],
        lsh_attn_chunk_length=CHUNK, num_hashes=num_hashes, num_buckets=num_buckets,
        lsh_num_chunks_before=chunks_before, lsh_num_chunks_after=chunks_after, is_decoder=True,
        hash_seed=HASH_SEED, lsh_attention_probs_dropout_prob=0.0, hidden_dropout_prob=0.0,
        max_position_embeddings=64,
    )
    torch.manual_seed(seed)
    attention = reformer.ReformerAttention(config, layer_id=0).eval()
    outputs = []
    attention.self_attention.register_forward_hook(lambda module, args, output: outputs.append(output.hidden_states))
    prompt_pass = padded_to or prompt_length
    hidden = torch.randn(BATCH, max(total, prompt_pass), HIDDEN)
    mask = None
    if padded_to or holes:
        mask = torch.zeros(1, prompt_pass, dtype=torch.long)
        mask[:, :prompt_length] = 1
        mask[:, list(holes)] = 0
    prompts, steps = [], []
    with torch.no_grad():
        for row in range(BATCH):
            outputs.clear()
            cache = reformer.ReformerDynamicCache()
            attention(
                hidden[row : row + 1, :prompt_pass], attention_mask=mask, past_buckets_states=cache, use_cache=True,
                orig_sequence_length=prompt_length,
            )
            for position in range(prompt_length, total):
                attention(
                    hidden[row : row + 1, position : position + 1], past_buckets_states=cache, use_cache=True,
                    orig_sequence_length=1,
                )
            assert (cache.buckets_cache[0].numel() > 0) == (prompt_pass > CHUNK or total >= CHUNK)
            prompts.append(outputs[0][:, :prompt_length])
            steps.append(torch.cat(outputs[1:], dim=1))
        normed = attention.layer_norm(hidden)
        query_key = (normed @ attention.self_attention.query_key.weight.T).reshape(BATCH, -1, HEADS, HEAD_DIM)
        value = (normed @ attention.self_attention.value.weight.T).reshape(BATCH, -1, HEADS, HEAD_DIM)
        torch.manual_seed(HASH_SEED)  # transformers' draw, reproduced
        rotations = torch.randn(lsh_rotations_shape(HEADS, HEAD_DIM, num_hashes, num_buckets))
    return (
        query_key.numpy(),
        value.numpy(),
        rotations.numpy(),
        torch.cat(prompts).reshape(BATCH, prompt_length, HEADS, HEAD_DIM).numpy(),
        torch.cat(steps).reshape(BATCH, total - prompt_length, HEADS, HEAD_DIM).numpy(),
    )


def _prompt(decoding, query_key, value, prompt_length, max_length, options, padded_to=None, holes=()):
    """Our prompt pass into a fresh cache: `(output, cache)`. A padded prompt
    gets the layer's mask over absolute positions."""
    cache = decoding.initial_cache(BATCH, max_length, HEADS, HEAD_DIM, "float32", **options)
    length = padded_to or prompt_length
    mask = None
    if padded_to or holes:
        mask = np.zeros((1, 1, 1, max_length), bool)
        mask[..., :prompt_length] = True
        mask[..., list(holes)] = False
    return decoding.attend_with_cache(
        query_key[:, :length], query_key[:, :length], value[:, :length], cache, 0, attention_mask=mask, **options
    )


def _case(prompt_length, total, num_hashes, num_buckets, chunks_before, chunks_after=0, padded_to=None, holes=()):
    return dict(
        prompt_length=prompt_length, total=total, num_hashes=num_hashes, num_buckets=num_buckets,
        chunks_before=chunks_before, chunks_after=chunks_after, padded_to=padded_to, holes=holes,
    )


def _case_options(case, rotations):
    """The decoding options of a case, with transformers' rotations."""
    options = _options(case["num_hashes"], case["num_buckets"], case["chunks_before"], case["chunks_after"])
    return {**options, "rotations": rotations}


CASES = {
    "prompt_of_two_chunks": _case(8, 18, 1, 4, 1),
    "short_prompt_crossing_chunk_length_factorised": _case(2, 14, 2, [2, 2], 1),
    "two_rounds_chunks_before_and_after": _case(8, 18, 2, 4, 1, 1),
    "prompt_of_one_chunk_no_chunk_before": _case(4, 14, 2, 8, 0, 1),
    "one_token_prompt": _case(1, 10, 2, 4, 1),
    # The model pads a prompt to a multiple of chunk_length: hashed, so the
    # steps use hashed windows over fewer than chunk_length positions at once.
    "padded_prompt_shorter_than_a_chunk": _case(3, 12, 1, 4, 1, padded_to=8),
    "padded_prompt_two_chunks_before": _case(6, 15, 1, [2, 4], 2, padded_to=8),
    # Padding inside the prompt: its bucket is cached (hashed prompt), or the
    # steps attend to it and hash it like any token (unhashed prompt).
    "prompt_with_padding_inside": _case(8, 16, 2, 4, 1, holes=(2, 5)),
    "short_prompt_with_padding_inside": _case(3, 11, 2, 4, 1, holes=(1,)),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_matches_transformers_decoding_step_by_step(case):
    case = CASES[case]
    query_key, value, rotations, expected_prompt, expected_steps = _transformers_decoding(**case, seed=1)
    options = _case_options(case, rotations)
    decoding = get_decoding("lsh")
    prompt_length, total = case["prompt_length"], case["total"]
    output, cache = _prompt(
        decoding, query_key, value, prompt_length, total + 2, options, case["padded_to"], case["holes"]
    )
    real = np.ones(prompt_length, bool)
    real[list(case["holes"])] = False  # a padding token's own output is unspecified
    np.testing.assert_allclose(_numpy(output)[:, :prompt_length][:, real], expected_prompt[:, real], atol=1e-5, rtol=0)
    for step, position in enumerate(range(prompt_length, total)):
        new = slice(position, position + 1)
        output, cache = decoding.attend_with_cache(
            query_key[:, new], query_key[:, new], value[:, new], cache, position, **options
        )
        np.testing.assert_allclose(
            _numpy(output)[:, 0], expected_steps[:, step], atol=1e-5, rtol=0, err_msg=f"position {position}"
        )


def test_feeding_position_zero_again_starts_afresh():
    # Generation may run a (hashed) prompt pass over more positions than the
    # prompt has and then feed from the prompt's end again. A step at position
    # 0 is a one-token prompt: transformers' one-token prompt pass never hashes.
    case = CASES["one_token_prompt"]
    query_key, value, rotations, expected_prompt, expected_steps = _transformers_decoding(**case, seed=1)
    options = _case_options(case, rotations)
    decoding = get_decoding("lsh")
    _, cache = _prompt(decoding, query_key, value, 8, 12, options)
    assert _numpy(cache[3]).all()
    outputs = []
    for position in range(case["total"]):
        new = slice(position, position + 1)
        output, cache = decoding.attend_with_cache(
            query_key[:, new], query_key[:, new], value[:, new], cache, position, **options
        )
        outputs.append(_numpy(output)[:, 0])
    np.testing.assert_allclose(outputs[0], expected_prompt[:, 0], atol=1e-5, rtol=0)
    np.testing.assert_allclose(np.stack(outputs[1:], axis=1), expected_steps, atol=1e-5, rtol=0)


def _compiled_steps(decoding, query_key, value, cache, start, stop, options):
    """Positions `start … stop − 1` through the step in one compiled
    `fori_loop` with a tensor index, as generation runs it
    (`compile_inference` around the loop, `compile_step` around the step)."""
    shape = (BATCH, 1, HEADS, HEAD_DIM)

    def step(query_key, value, cache, index):
        return decoding.attend_with_cache(query_key, query_key, value, cache, index, **options)

    step = backend_support.compile_step(step, [])

    def run(query_key, value, cache):
        def body(index, carry):
            cache, outputs = carry
            output, cache = step(
                ops.slice(query_key, [0, index, 0, 0], shape), ops.slice(value, [0, index, 0, 0], shape), cache, index
            )
            return cache, ops.slice_update(outputs, [0, index - start, 0, 0], output)

        outputs = ops.zeros((BATCH, stop - start, HEADS, HEAD_DIM))
        return ops.fori_loop(start, stop, body, (cache, outputs))[1]

    return _numpy(backend_support.compile_inference(run, [])(query_key, value, cache))


def test_the_step_compiles_in_a_loop_with_a_tensor_index():
    case = CASES["short_prompt_crossing_chunk_length_factorised"]
    query_key, value, rotations, _, expected_steps = _transformers_decoding(**case, seed=3)
    options = _case_options(case, ops.convert_to_tensor(rotations))
    decoding = get_decoding("lsh")
    _, cache = _prompt(decoding, query_key, value, case["prompt_length"], 16, options)
    got = _compiled_steps(decoding, query_key, value, cache, case["prompt_length"], case["total"], options)
    np.testing.assert_allclose(got, expected_steps, atol=1e-5, rtol=0)


def test_seeded_rotations_are_numpys_draw_and_survive_compilation():
    # Without `rotations`, every call hashes with numpy's standard normal draw
    # of `seed` (DECODING_SEED by default) — also when the step is compiled or
    # traced (a traced keras.random draw would change from step to step).
    rng = np.random.default_rng(0)
    query_key, value = (rng.normal(size=(BATCH, 14, HEADS, HEAD_DIM)).astype("float32") for _ in range(2))
    options = _options(2, 4, 1, 0)
    decoding = get_decoding("lsh")
    shape = lsh_rotations_shape(HEADS, HEAD_DIM, 2, 4)

    def compiled(options):
        _, cache = _prompt(decoding, query_key, value, 8, 16, options)
        return _compiled_steps(decoding, query_key, value, cache, 8, 14, options)

    for seed in (None, 5):
        drawn = np.random.default_rng(DECODING_SEED if seed is None else seed).standard_normal(shape)
        explicit = {**options, "rotations": drawn.astype("float32")}
        expected = []
        _, cache = _prompt(decoding, query_key, value, 8, 16, explicit)
        for position in range(8, 14):
            new = slice(position, position + 1)
            output, cache = decoding.attend_with_cache(
                query_key[:, new], query_key[:, new], value[:, new], cache, position, **explicit
            )
            expected.append(_numpy(output)[:, 0])
        got = compiled(options if seed is None else {**options, "seed": seed})
        np.testing.assert_allclose(got, np.stack(expected, axis=1), atol=1e-6, rtol=0)
    assert not np.allclose(compiled({**options, "seed": 6}), got, atol=1e-3)  # the seed decides


def _shared_qk_causal_attention(query_key, value):
    """Causal shared-QK softmax attention in numpy: unit-length keys
    (transformers' norm), no 1/√d, the self-logit −1e5."""
    keys = query_key / np.sqrt(np.mean(query_key**2, -1, keepdims=True) + 1e-6) / np.sqrt(query_key.shape[-1])
    logits = np.einsum("blnd,bsnd->bnls", query_key, keys).astype("float64")
    length = query_key.shape[1]
    logits = np.where(np.tril(np.ones((length, length), bool)), logits, -np.inf)
    logits = np.where(np.eye(length, dtype=bool), -1e5, logits)
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    return np.einsum("bnls,bsnd->blnd", weights / weights.sum(-1, keepdims=True), value)


def test_before_any_hashing_a_layer_decodes_as_its_full_causal_pass():
    # While the sequence fits in one chunk nothing is hashed: the prompt pass
    # and every step are causal shared-QK attention, so decoding with
    # MultiHeadAttention(attention="lsh") gives its full pass.
    from attention_zoo_keras.layers import MultiHeadAttention

    options = {"num_hashes": 2, "num_buckets": 4, "chunk_length": 16}
    layer = MultiHeadAttention(num_heads=HEADS, head_dim=HEAD_DIM, attention="lsh", attention_options=options)
    hidden = np.random.default_rng(1).normal(size=(BATCH, 9, HIDDEN)).astype("float32")
    expected = _numpy(layer(hidden, is_causal=True))
    cache = layer.initial_cache(BATCH, 12)
    output, cache = layer(hidden[:, :4], is_causal=True, cache=cache, cache_update_index=0)
    outputs = [_numpy(output)]
    for position in range(4, 9):
        output, cache = layer(
            hidden[:, position : position + 1], is_causal=True, cache=cache,
            cache_update_index=ops.convert_to_tensor(position),
        )
        outputs.append(_numpy(output))
    np.testing.assert_allclose(np.concatenate(outputs, axis=1), expected, atol=1e-5, rtol=0)
    assert not np.any(_numpy(cache[3]))  # never hashed

    # The mechanism itself against a numpy reference.
    rng = np.random.default_rng(2)
    query_key, value = (rng.normal(size=(BATCH, 9, HEADS, HEAD_DIM)).astype("float32") for _ in range(2))
    decoding = get_decoding("lsh")
    output, cache = _prompt(decoding, query_key, value, 3, 10, options)
    outputs = [_numpy(output)]
    for position in range(3, 9):
        new = slice(position, position + 1)
        output, cache = decoding.attend_with_cache(
            query_key[:, new], query_key[:, new], value[:, new], cache, position, **options
        )
        outputs.append(_numpy(output))
    np.testing.assert_allclose(
        np.concatenate(outputs, axis=1), _shared_qk_causal_attention(query_key, value), atol=1e-5, rtol=0
    )


def test_cache_layout_batch_first_and_reorderable():
    decoding = get_decoding("lsh")
    assert isinstance(decoding, LSHDecodingCache) and decoding.position_addressed
    options = _options(3, [2, 4], 1, 0)
    cache = decoding.initial_cache(BATCH, 11, HEADS, HEAD_DIM, "float32", **options)
    assert [tuple(t.shape) for t in cache] == [
        (BATCH, 11, HEADS, HEAD_DIM), (BATCH, 11, HEADS, HEAD_DIM), (BATCH, 11, HEADS, 3), (BATCH,)
    ]
    assert [keras.backend.standardize_dtype(t.dtype) for t in cache] == ["float32", "float32", "int32", "bool"]

    # A prompt longer than the cache fills it; then reordering the rows along
    # axis 0 (as beam search does) reorders the rows' decoding.
    rng = np.random.default_rng(3)
    query_key, value = (rng.normal(size=(BATCH, 16, HEADS, HEAD_DIM)).astype("float32") for _ in range(2))
    _, cache = decoding.attend_with_cache(query_key[:, :12], query_key[:, :12], value[:, :12], cache, 0, **options)
    np.testing.assert_array_equal(_numpy(cache[0]), query_key[:, :11])
    assert _numpy(cache[3]).all()
    swapped = [ops.take(t, [1, 0], axis=0) for t in cache]
    for position in (8, 9, 10):
        new = slice(position, position + 1)
        output, cache = decoding.attend_with_cache(
            query_key[:, new], query_key[:, new], value[:, new], cache, position, **options
        )
        swapped_output, swapped = decoding.attend_with_cache(
            query_key[::-1, new], query_key[::-1, new], value[::-1, new], swapped, position, **options
        )
        np.testing.assert_allclose(_numpy(swapped_output), _numpy(output)[::-1], atol=1e-6, rtol=0)
    for tensor, swapped_tensor in zip(cache, swapped):
        np.testing.assert_array_equal(_numpy(swapped_tensor), _numpy(tensor)[::-1])


@pytest.mark.parametrize("index", [3, "tensor_zero"])
def test_several_new_positions_only_in_the_prompt_pass(index):
    decoding = get_decoding("lsh")
    options = _options(1, 4, 1, 0)
    cache = decoding.initial_cache(1, 12, HEADS, HEAD_DIM, "float32", **options)
    x = np.zeros((1, 4, HEADS, HEAD_DIM), "float32")
    index = ops.convert_to_tensor(0) if index == "tensor_zero" else index
    with pytest.raises(ValueError, match="LSH decoding feeds one token at a time after the prompt pass"):
        decoding.attend_with_cache(x, x, x, cache, index, **options)


def test_num_buckets_and_num_hashes_must_fit():
    decoding = get_decoding("lsh")
    cache = decoding.initial_cache(1, 12, HEADS, HEAD_DIM, "float32", num_hashes=2)
    x = np.zeros((1, 1, HEADS, HEAD_DIM), "float32")
    with pytest.raises(ValueError, match="LSH decoding needs num_buckets"):
        decoding.attend_with_cache(x, x, x, cache, 0, num_hashes=2, chunk_length=4)
    with pytest.raises(ValueError, match="holds buckets of 2 hashing rounds, but the call has num_hashes=3"):
        decoding.attend_with_cache(x, x, x, cache, 0, num_hashes=3, num_buckets=4, chunk_length=4)
