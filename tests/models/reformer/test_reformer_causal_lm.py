"""The Reformer language model against a random-weight tiny `transformers`
`ReformerModelWithLMHead` (local and LSH layers mixed, several hash
rounds, factorised buckets, axial positions): logits within 1e-4 (fp32),
greedy generation token for token; training, its length errors, saving,
and the named presets on the local hub.

Both implementations get the same LSH rotations: transformers draws them
with `torch.manual_seed(hash_seed); torch.randn(shape)` at every call, the
tests draw that tensor the same way and set it on our LSH branches
(`ReformerBackbone.set_lsh_rotations`). transformers 5.0-5.23 do not add
`lm_head.bias` (4.x and the original model do; 5.24 adds its own
`lm_head.decoder.bias`, which the converter reads), so the checkpoints here
have `lm_head.bias` at zero; `test_the_lm_head_bias_is_added` checks that ours
adds its bias.
"""

import keras
import numpy as np
import pytest

import attention_zoo_keras as azk
from attention_zoo_keras.models.reformer import ReformerBackbone
from attention_zoo_keras.models.reformer import ReformerByteTokenizer
from attention_zoo_keras.models.reformer import ReformerCausalLM
from attention_zoo_keras.models.reformer import ReformerCausalLMPreprocessor
from tests.support.tiny_checkpoints import perturbed

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

ATOL = 1e-4
HASH_SEED = 3
HEADS, HEAD_DIM = 2, 8
MIXED = dict(  # local chunks of 8, LSH chunks of 4: inputs pad to multiples of 8 above 4 tokens
    vocab_size=258, hidden_size=16, num_attention_heads=HEADS, attention_head_size=HEAD_DIM, feed_forward_size=32,
    attn_layers=["local", "lsh", "local", "lsh"], num_hashes=2, num_buckets=[2, 2], lsh_attn_chunk_length=4,
    local_attn_chunk_length=8, axial_pos_shape=[4, 8], axial_pos_embds_dim=[6, 10], max_position_embeddings=32,
)
LSH_ONLY = dict(  # learned positions, one hash round, 4 buckets
    vocab_size=258, hidden_size=16, num_attention_heads=HEADS, attention_head_size=HEAD_DIM, feed_forward_size=32,
    attn_layers=["lsh", "lsh"], num_hashes=1, num_buckets=4, lsh_attn_chunk_length=4, axial_pos_embds=False,
    max_position_embeddings=48, hidden_act="gelu",
)
COMMON = dict(
    is_decoder=True, hash_seed=HASH_SEED, hidden_dropout_prob=0.0, local_attention_probs_dropout_prob=0.0,
    lsh_attention_probs_dropout_prob=0.0, pad_token_id=0, eos_token_id=1,
)
CONFIGS = {"mixed": MIXED, "lsh_only": LSH_ONLY}


def _numpy(x):
    return np.asarray(keras.ops.convert_to_numpy(x))


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def checkpoint(request, tmp_path_factory):
    """`(directory, transformers model, hf config)` of a tiny random
    `ReformerModelWithLMHead` saved with `save_pretrained` (byte-level
    vocabulary: the converter builds the enwik8 byte tokenizer)."""
    config = transformers.ReformerConfig(**CONFIGS[request.param], **COMMON)
    torch.manual_seed(0)
    model = perturbed(transformers.ReformerModelWithLMHead(config), 5).eval()
    with torch.no_grad():
        model.lm_head.bias.zero_()
    directory = tmp_path_factory.mktemp(f"reformer_{request.param}")
    model.save_pretrained(directory)
    return directory, model, config


def _with_their_rotations(lm, config):
    """Sets transformers' rotations (its `hash_seed` draw) on every LSH branch."""
    torch.manual_seed(HASH_SEED)
    lm.backbone.set_lsh_rotations(torch.randn(lm.backbone.lsh_rotations_shape).numpy())
    return lm


@pytest.fixture(scope="module")
def converted(checkpoint):
    directory, _, config = checkpoint
    return _with_their_rotations(ReformerCausalLM.from_preset(str(directory)), config)


@pytest.mark.parametrize("length", [3, 5, 8, 13, 16, 32])
def test_logits_match_transformers(checkpoint, converted, length):
    _, model, _ = checkpoint
    ids = np.random.default_rng(length).integers(2, 258, size=(2, length))
    with torch.no_grad():
        expected = model(torch.tensor(ids)).logits.numpy()
    logits = _numpy(converted({"token_ids": ids, "padding_mask": np.ones_like(ids)}))
    assert logits.shape == expected.shape
    np.testing.assert_allclose(logits, expected, atol=ATOL)


def test_right_padded_batch_matches_transformers(checkpoint, converted):
    _, model, _ = checkpoint
    ids = np.random.default_rng(1).integers(2, 258, size=(2, 16))
    mask = np.ones_like(ids)
    mask[1, 11:] = 0
    with torch.no_grad():
        expected = model(torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
    logits = _numpy(converted({"token_ids": ids, "padding_mask": mask}))
    np.testing.assert_allclose(logits[mask == 1], expected[mask == 1], atol=ATOL)


@pytest.mark.parametrize("prompt_length", [3, 7, 12])
def test_greedy_generation_matches_transformers(checkpoint, converted, prompt_length):
    _, model, _ = checkpoint
    prompt = np.random.default_rng(prompt_length).integers(2, 258, size=(1, prompt_length))
    new_tokens = 14
    with torch.no_grad():
        expected = model.generate(
            torch.tensor(prompt), max_new_tokens=new_tokens, do_sample=False, pad_token_id=0, eos_token_id=None
        ).numpy()
    generated = converted.generate({"token_ids": prompt}, max_new_tokens=new_tokens, stop_token_ids=None)
    np.testing.assert_array_equal(generated["token_ids"], expected)


def test_greedy_generation_with_decoding_controls_matches_transformers(checkpoint, converted):
    """The decoding controls through the Reformer's own decoding (its LSH
    and local caches, a body run eagerly around the recorded step under
    torch): the tokens of `transformers`' `generate` with the same
    controls, and the scores of `compute_transition_scores`. Each control
    is taken from the unconstrained output so that it matters."""
    _, model, _ = checkpoint
    prompt = np.random.default_rng(7).integers(2, 258, size=(1, 7))

    def theirs(**controls):
        with torch.no_grad():
            out = model.generate(
                torch.tensor(prompt), max_new_tokens=12, do_sample=False, pad_token_id=0, eos_token_id=None,
                return_dict_in_generate=True, output_scores=True, **controls,
            )
        scores = model.compute_transition_scores(out.sequences, out.scores, normalize_logits=True)
        return out.sequences.numpy(), scores.numpy()

    plain, _ = theirs()
    new = plain[0, 7:].tolist()
    controls = dict(repetition_penalty=1.4, no_repeat_ngram_size=2, bad_words_ids=[[new[1]], [new[3], new[4]]])
    expected, expected_scores = theirs(**controls)
    assert not np.array_equal(expected, plain)

    generated = converted.generate({"token_ids": prompt}, max_new_tokens=12, stop_token_ids=None, return_scores=True,
                                   **controls)
    np.testing.assert_array_equal(generated["token_ids"], expected)
    np.testing.assert_allclose(generated["scores"][:, 7:], expected_scores, atol=ATOL)


def test_the_lm_head_bias_is_added(checkpoint, converted):
    ids = np.array([[5, 6, 7]])
    features = {"token_ids": ids, "padding_mask": np.ones_like(ids)}
    bias = np.linspace(-1.0, 1.0, 258).astype("float32")
    loaded_bias = _numpy(converted.lm_head.bias)  # transformers 5.24's decoder bias; zero before
    before = _numpy(converted(features))
    converted.lm_head.bias.assign(bias)
    try:
        np.testing.assert_allclose(_numpy(converted(features)), before - loaded_bias + bias, atol=1e-5)
    finally:
        converted.lm_head.bias.assign(loaded_bias)


def _tiny_lm(sequence_length=32, hash_seed=None):
    options = dict(
        vocabulary_size=258, hidden_dim=16, num_heads=2, head_dim=8, intermediate_dim=32, attention=["local", "lsh"],
        attention_options={"lsh": {"num_hashes": 2, "num_buckets": 4, "chunk_length": 4, "seed": hash_seed},
                           "local": {"block_size": 8}},
        axial_pos_shape=(4, 8), axial_pos_embds_dim=(6, 10), dropout=0.0, attention_dropout=0.0, seed=1,
    )
    preprocessor = ReformerCausalLMPreprocessor(ReformerByteTokenizer(), sequence_length=sequence_length)
    return ReformerCausalLM(ReformerBackbone(**options), preprocessor)


@pytest.mark.slow
def test_fit_learns_a_repeating_text():
    keras.utils.set_random_seed(0)
    lm = _tiny_lm()
    lm.compile(optimizer=keras.optimizers.Adam(3e-3))
    texts = ["abcdabcdabcdabcdabcdabcdabcdabcd"] * 8
    history = lm.fit(texts, batch_size=4, epochs=30, verbose=0)
    assert history.history["loss"][-1] < 0.3 * history.history["loss"][0]
    assert lm.generate("abcdab", max_new_tokens=6, stop_token_ids=None) == "abcdabcdabcd"


def test_training_length_must_be_a_multiple_of_the_chunks():
    lm = _tiny_lm(sequence_length=20)
    with pytest.raises(ValueError, match=r"multiple of the chunk lengths' least common multiple 8.*pad the inputs to 24"):
        lm.fit(["some text to learn"] * 2, batch_size=2, epochs=1, verbose=0)


def test_training_length_must_fill_the_axial_positions():
    lm = _tiny_lm(sequence_length=16)
    with pytest.raises(ValueError, match=r"number of axial positions.*length 16.*32 positions"):
        lm.fit(["some text to learn"] * 2, batch_size=2, epochs=1, verbose=0)


def test_inputs_longer_than_the_positions_are_refused(converted):
    positions = converted.backbone.max_sequence_length
    ids = np.full((1, positions + 1), 5)
    with pytest.raises(ValueError, match=f"length {positions + 1}.* {positions} positions"):
        converted({"token_ids": ids, "padding_mask": np.ones_like(ids)})
    ids = np.full((1, 3), 300)
    with pytest.raises(ValueError, match="outside the valid range"):
        converted({"token_ids": ids, "padding_mask": np.ones_like(ids)})


def test_save_and_load_round_trip(tmp_path):
    lm = _tiny_lm(hash_seed=4)
    ids = np.random.default_rng(0).integers(2, 258, size=(2, 13))
    features = {"token_ids": ids, "padding_mask": np.ones_like(ids)}
    expected = _numpy(lm(features))
    lm.save_to_preset(tmp_path / "preset")
    restored = ReformerCausalLM.from_preset(str(tmp_path / "preset"))
    np.testing.assert_allclose(_numpy(restored(features)), expected, atol=1e-6)
    assert restored.preprocessor.tokenizer.encode(["héllo"]) == lm.preprocessor.tokenizer.encode(["héllo"])


def test_named_presets_point_at_the_google_checkpoints():
    presets = azk.list_presets()
    assert presets["reformer_crime_and_punishment"]["source"] == "hf://google/reformer-crime-and-punishment"
    assert presets["reformer_enwik8"]["source"] == "hf://google/reformer-enwik8"
    assert presets["reformer_enwik8"]["class_name"] == presets["reformer_crime_and_punishment"]["class_name"] == (
        "ReformerCausalLM"
    )


def test_predict_and_evaluate_follow_changing_lengths():
    """The chunked attention needs a static length: Keras' compiled functions
    are made anew when it changes (TensorFlow would otherwise trace a
    second length as unknown)."""
    lm = _tiny_lm(hash_seed=5)  # the same rotations in every call
    for length in (16, 8, 13, 16):
        ids = np.random.default_rng(length).integers(2, 258, size=(2, length))
        features = {"token_ids": ids, "padding_mask": np.ones_like(ids)}
        np.testing.assert_allclose(lm.predict(features, verbose=0), _numpy(lm(features)), atol=1e-5)
        assert np.isfinite(lm.evaluate(features, ids, verbose=0, return_dict=True)["loss"])


def test_beam_search_and_sampling_over_prompts_of_different_lengths(converted):
    prompts = {"token_ids": np.array([[5, 6, 7, 8, 9, 10, 11], [12, 13, 14, 0, 0, 0, 0]]),
               "padding_mask": np.array([[1] * 7, [1, 1, 1, 0, 0, 0, 0]])}
    greedy = converted.generate(prompts, max_new_tokens=6, stop_token_ids=None)
    one_beam = converted.generate(prompts, max_new_tokens=6, stop_token_ids=None, sampler="beam", num_beams=1)
    np.testing.assert_array_equal(one_beam["token_ids"], greedy["token_ids"])
    alone = converted.generate({"token_ids": prompts["token_ids"][1:, :3]}, max_new_tokens=6, stop_token_ids=None)
    np.testing.assert_array_equal(greedy["token_ids"][1, :9], alone["token_ids"][0])  # as if alone in the batch
    beams = converted.generate(prompts, max_new_tokens=6, stop_token_ids=None, sampler="beam", num_beams=3)
    sampled = converted.generate(prompts, max_new_tokens=6, stop_token_ids=None, sampler="top_k", k=5, seed=0)
    for result in (beams, sampled):
        np.testing.assert_array_equal(result["padding_mask"].sum(axis=1), [13, 9])
        np.testing.assert_array_equal(result["token_ids"][0, :7], prompts["token_ids"][0])
        np.testing.assert_array_equal(result["token_ids"][1, :3], prompts["token_ids"][1, :3])
