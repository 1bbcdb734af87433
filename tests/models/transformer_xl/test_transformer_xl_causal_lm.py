"""Transformer-XL's memory: segments with memory equal one pass with the
same attention span, training and evaluation carry it across batches
without gradient, generation with it equals recomputation, bad memories and
ids fail clearly, and it is never saved."""

import keras
import numpy as np
import pytest
from safetensors import safe_open

from attention_zoo_keras.metrics import BitsPerCharacter
from attention_zoo_keras.metrics import Perplexity
from attention_zoo_keras.models.transformer_xl import TransformerXLBackbone
from attention_zoo_keras.models.transformer_xl import TransformerXLCausalLM
from tests.support.family_tests import run_backbone_test
from tests.support.family_tests import run_config_round_trip_test

VOCABULARY_SIZE = 60
MEM_LEN = 6


def _backbone(same_length=True, mem_len=MEM_LEN, **overrides):
    keras.utils.set_random_seed(1)
    config = dict(
        vocabulary_size=VOCABULARY_SIZE, num_layers=2, num_heads=2, hidden_dim=16, head_dim=8, intermediate_dim=32,
        mem_len=mem_len, cutoffs=[20, 40], div_val=2, clamp_len=4, same_length=same_length, dropout=0.0,
        initializer_range=0.3, projection_initializer_range=0.3,
    )
    config.update(overrides)
    return TransformerXLBackbone(**config)


def _lm(**overrides):
    lm = TransformerXLCausalLM(_backbone(**overrides))
    rng = np.random.default_rng(0)
    for variable in lm.lm_head.trainable_variables:  # non-zero biases, so the head matters too
        variable.assign(variable.numpy() + rng.normal(0, 0.3, variable.shape).astype("float32"))
    return lm


def _numpy(x):
    return np.asarray(keras.ops.convert_to_numpy(x))


def _tokens(batch, length, seed=0):
    return np.random.default_rng(seed).integers(0, VOCABULARY_SIZE, size=(batch, length)).astype("int32")


@pytest.mark.parametrize("initial_length, norm_first", [(0, False), (MEM_LEN, False), (MEM_LEN, True)])
def test_segments_with_memory_equal_one_pass_with_the_same_span(initial_length, norm_first):
    # With same_length every query sees the last mem_len positions, so cutting
    # the stream into segments and carrying the memory changes nothing.
    backbone = _backbone(norm_first=norm_first)
    ids = _tokens(2, 15)
    memory = backbone.initial_memory(2, initial_length)
    one_pass = _numpy(backbone({"token_ids": ids, "memory": memory})["sequence_output"])
    outputs = []
    for start in range(0, 15, 5):
        result = backbone({"token_ids": ids[:, start : start + 5], "memory": memory})
        outputs.append(_numpy(result["sequence_output"]))
        memory = result["memory"]
    np.testing.assert_allclose(np.concatenate(outputs, axis=1), one_pass, atol=1e-5, rtol=0)


def test_memory_matters_and_grows_to_mem_len():
    backbone = _backbone()
    ids = _tokens(1, 4)
    empty = backbone({"token_ids": ids, "memory": backbone.initial_memory(1, 0)})
    assert tuple(empty["memory"].shape) == (1, 2, 4, 16)  # min(0 + 4, mem_len)
    second = backbone({"token_ids": ids, "memory": empty["memory"]})
    assert tuple(second["memory"].shape) == (1, 2, MEM_LEN, 16)
    # The memory holds each block's inputs: block 0's are the embeddings.
    np.testing.assert_allclose(_numpy(empty["memory"][:, 0]), _numpy(backbone.token_embedding(ids)), atol=1e-6)
    assert not np.allclose(_numpy(second["sequence_output"]), _numpy(empty["sequence_output"]), atol=1e-3)


def _manual_stream_nll(lm, stream, batch_size, segment_length):
    """Mean NLL of a stream read as `batch_size` rows of consecutive segments,
    the memory carried by hand through `score` (zeros at the start)."""
    per_row = len(stream) // batch_size
    rows = stream[: per_row * batch_size].reshape(batch_size, per_row)
    memory, total, count = None, 0.0, 0
    for start in range(0, per_row - 1, segment_length):
        stop = min(start + segment_length, per_row - 1)
        result = lm.score(rows[:, start:stop], memory)
        log_probabilities = _numpy(result["log_probabilities"])
        labels = rows[:, start + 1 : stop + 1]
        total -= np.take_along_axis(log_probabilities, labels[..., None], axis=-1).sum()
        count += labels.size
        memory = result["memory"]
    return total / count


def test_evaluate_carries_the_memory_across_batches():
    lm = _lm()
    stream = np.random.default_rng(3).integers(0, VOCABULARY_SIZE, size=83)
    lm.compile()
    results = lm.evaluate(stream, batch_size=2, verbose=0, return_dict=True)
    # Segments of mem_len tokens (no preprocessor), the last one padded:
    # the perplexity over real tokens is what scoring segment by segment,
    # the memory carried by hand, gives.
    expected = _manual_stream_nll(lm, stream, batch_size=2, segment_length=MEM_LEN)
    np.testing.assert_allclose(results["perplexity"], np.exp(expected), rtol=1e-4)
    # Scoring each segment from a fresh memory gives another number: the
    # comparison can tell whether the memory was carried.
    rows = stream[:82].reshape(2, 41)
    fresh = [_numpy(lm.score(rows[:, s : s + MEM_LEN])["log_probabilities"]) for s in range(0, 36, MEM_LEN)]
    fresh_nll = -np.mean([
        np.take_along_axis(lp, rows[:, s + 1 : s + 1 + MEM_LEN, None], axis=-1).mean()
        for lp, s in zip(fresh, range(0, 36, MEM_LEN))
    ])
    assert abs(fresh_nll - expected) > 1e-3


def test_perplexity_and_bits_per_character_are_the_token_mean_nll():
    lm = _lm()
    stream = np.random.default_rng(4).integers(0, VOCABULARY_SIZE, size=61)
    lm.compile(weighted_metrics=[Perplexity(), BitsPerCharacter()])
    results = lm.evaluate(stream, batch_size=3, verbose=0, return_dict=True)
    expected = _manual_stream_nll(lm, stream, batch_size=3, segment_length=MEM_LEN)
    np.testing.assert_allclose(results["perplexity"], np.exp(expected), rtol=1e-4)
    np.testing.assert_allclose(results["bits_per_character"], expected / np.log(2), rtol=1e-4)


def test_fit_trains_on_ordered_segments_and_keeps_memory_out_of_the_gradient(tmp_path):
    lm = _lm()
    stream = np.tile(np.arange(10, 22), 12)  # a repeated pattern: learnable
    lm.compile(optimizer=keras.optimizers.Adam(1e-2))
    history = lm.fit(stream, batch_size=2, epochs=4, verbose=0)
    losses = history.history["loss"]
    assert losses[-1] < losses[0] * 0.7
    memory_variables = lm.unsaved_variables
    assert len(memory_variables) == 1 and tuple(memory_variables[0].shape) == (2, 2, MEM_LEN, 16)
    assert not memory_variables[0].trainable
    assert all(v is not memory_variables[0] for v in lm.trainable_variables)
    assert np.abs(_numpy(memory_variables[0])).max() > 0  # carried, not left at zero
    # The memory is run-time state: never written with the weights.
    lm.save_to_preset(tmp_path / "preset")
    with safe_open(str(tmp_path / "preset" / "model.safetensors"), framework="numpy") as weights:
        keys = set(weights.keys())
    assert not any("memory" in key for key in keys)
    reloaded = TransformerXLCausalLM.from_preset(str(tmp_path / "preset"), preprocessor=None)
    ids = _tokens(2, 5)
    np.testing.assert_allclose(
        _numpy(reloaded.score(ids)["log_probabilities"]), _numpy(lm.score(ids)["log_probabilities"]), atol=1e-5
    )


def test_validation_split_holds_out_the_stream_tail_read_in_order():
    stream = np.tile(np.arange(10, 22), 10)  # 120 tokens: the last 30 held out
    split = _lm()
    split.compile(optimizer=keras.optimizers.SGD(0.1))
    split_history = split.fit(stream, batch_size=2, epochs=1, validation_split=0.25, verbose=0)
    held_out = _lm()
    held_out.compile(optimizer=keras.optimizers.SGD(0.1))
    held_out_history = held_out.fit(stream[:90], batch_size=2, epochs=1, validation_data=stream[90:], verbose=0)
    for name in ("loss", "val_loss"):
        np.testing.assert_allclose(split_history.history[name], held_out_history.history[name], rtol=1e-5)
    # The last validation ran on the trained weights over the tail as its own
    # stream, the memory carried from segment to segment: evaluate's number.
    tail = split.evaluate(stream[90:], batch_size=2, verbose=0, return_dict=True)
    np.testing.assert_allclose(split_history.history["val_loss"][-1], tail["loss"], rtol=1e-5)
    expected = _manual_stream_nll(split, stream[90:], batch_size=2, segment_length=MEM_LEN)
    np.testing.assert_allclose(tail["perplexity"], np.exp(expected), rtol=1e-4)


def test_a_validation_stream_too_short_for_the_rows_is_refused():
    lm = _lm()
    lm.compile()
    stream = np.arange(10, 40)
    with pytest.raises(ValueError, match=r"validation stream .* 3 tokens is too short for 2 parallel rows"):
        lm.fit(stream, batch_size=2, validation_split=0.1, verbose=0)
    with pytest.raises(ValueError, match=r"validation_split must be between 0 and 1; got 1.5"):
        lm.fit(stream, batch_size=2, validation_split=1.5, verbose=0)


def test_a_new_batch_size_replaces_the_memory():
    lm = _lm()
    stream = np.random.default_rng(5).integers(0, VOCABULARY_SIZE, size=60)
    lm.compile()
    lm.evaluate(stream, batch_size=2, verbose=0)
    lm.evaluate(stream, batch_size=3, verbose=0)
    assert [tuple(v.shape)[0] for v in lm.unsaved_variables] == [3]
    with pytest.raises(ValueError, match="holds 3 streams"):
        lm({"token_ids": _tokens(2, 4)})


def test_get_weights_leave_out_the_memory_so_a_fresh_model_takes_them():
    """With a stream memory, `get_weights` holds the saved weights only; a
    fresh model given them computes the same log-probabilities (from no
    memory), and a list of another length or shape is refused."""
    lm = _lm()
    tokens = _tokens(2, 5)
    expected = _numpy(lm({"token_ids": tokens}))
    lm.reset_memory(2)
    lm({"token_ids": tokens})
    weights = lm.get_weights()
    assert len(weights) == len(lm.weights) - len(lm.unsaved_variables) and lm.unsaved_variables
    fresh = TransformerXLCausalLM(_backbone(), name="fresh")
    fresh.set_weights(weights)
    np.testing.assert_allclose(_numpy(fresh({"token_ids": tokens})), expected, atol=1e-6)
    with pytest.raises(ValueError, match="takes .* arrays"):
        fresh.set_weights(weights[:-1])
    with pytest.raises(ValueError, match="has the shape"):
        fresh.set_weights([np.zeros((1,), "float32")] + weights[1:])


@pytest.mark.parametrize("same_length", [True, False])
def test_greedy_generation_with_memory_equals_recomputation(same_length):
    lm = _lm(same_length=same_length)
    prompts = {"token_ids": np.array([[5, 9, 31, 44], [7, 0, 0, 0]], "int32"),
               "padding_mask": np.array([[1, 1, 1, 1], [1, 0, 0, 0]], "int32")}
    # Longer than the memory with same_length (the window slides); within
    # it otherwise (a one-pass recomputation sees the whole prefix).
    max_length = 14 if same_length else MEM_LEN + 1
    generated = lm.generate(prompts, max_length=max_length, stop_token_ids=None)
    for row, length in enumerate((4, 1)):
        ids = generated["token_ids"][row]
        assert generated["padding_mask"][row].sum() == max_length
        log_probabilities = _recomputed_log_probabilities(lm, ids)
        for position in range(length, max_length):
            assert ids[position] == log_probabilities[position - 1].argmax(), (row, position)


def _recomputed_log_probabilities(lm, ids):
    """Row `p - 1` is the next-token log-probabilities after `ids[:p]`,
    recomputed without memory: one pass over all of `ids`, which gives each
    prefix's own result since the model is causal and, without memory, the
    `same_length` window is the same at every length (the last `mem_len`
    positions: `tests/attention/test_xl.py`). One pass instead of one per
    prefix: on JAX each new length compiles every operation again."""
    return _numpy(lm.score(ids[None], lm.backbone.initial_memory(1, 0))["log_probabilities"])[0]


def test_decoding_controls_equal_recomputation_with_transformers_processors():
    """Transformer-XL's memory as the decoding cache, with the decoding
    controls: each greedy token is the argmax of a full recomputation
    (`score` of the prefix) put through `transformers`' logits processors
    of the same names, and its score that distribution's log-probability.
    Prompts of two lengths are decoded apart (`decodes_prompt_lengths_apart`),
    each row's `min_new_tokens` counted from its own prompt."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    lm = _lm(same_length=True)  # (a recomputation equals generation past the memory: see above)
    prompts = {"token_ids": np.array([[5, 9, 31, 44], [7, 0, 0, 0]], "int32"),
               "padding_mask": np.array([[1, 1, 1, 1], [1, 0, 0, 0]], "int32")}
    stop = int(lm.generate(prompts, max_new_tokens=2, stop_token_ids=None)["token_ids"][1, 1])  # row 1's first token
    controls = dict(min_new_tokens=3, repetition_penalty=1.5, no_repeat_ngram_size=2, bad_words_ids=[[12], [5, 9]])
    generated = lm.generate(prompts, max_length=14, stop_token_ids=[stop], return_scores=True, **controls)
    plain = lm.generate(prompts, max_length=14, stop_token_ids=[stop])
    assert [list(ids[mask == 1]) for ids, mask in zip(plain["token_ids"], plain["padding_mask"])] != [
        list(ids[mask == 1]) for ids, mask in zip(generated["token_ids"], generated["padding_mask"])]
    for row, length in enumerate((4, 1)):
        processors = transformers.LogitsProcessorList([
            transformers.RepetitionPenaltyLogitsProcessor(1.5),
            transformers.NoRepeatNGramLogitsProcessor(2),
            transformers.NoBadWordsLogitsProcessor([[12], [5, 9]], eos_token_id=[stop]),
            transformers.MinNewTokensLengthLogitsProcessor(length, 3, [stop]),
        ])
        ids = generated["token_ids"][row][generated["padding_mask"][row].astype(bool)]
        assert len(ids) > length + 3 or ids[-1] == stop
        log_probabilities = _recomputed_log_probabilities(lm, ids)
        for position in range(length, len(ids)):
            prefix = ids[None, :position]
            scores = torch.tensor(log_probabilities[None, position - 1])
            processed = processors(torch.tensor(prefix, dtype=torch.long), scores)
            assert ids[position] == int(processed.argmax()), (row, position)
            expected_score = float(torch.log_softmax(processed, dim=-1)[0, ids[position]])
            assert abs(generated["scores"][row, position] - expected_score) < 1e-4, (row, position)


def test_generation_and_sampling_run_with_beam_search():
    lm = _lm()
    prompts = {"token_ids": np.array([[5, 9, 31]], "int32")}
    beams = lm.generate(prompts, max_new_tokens=5, sampler="beam", num_beams=3, stop_token_ids=None)
    assert beams["token_ids"].shape == (1, 8)
    sampled = lm.generate(prompts, max_new_tokens=5, sampler="top_k", k=5, seed=1, stop_token_ids=None)
    again = lm.generate(prompts, max_new_tokens=5, sampler="top_k", k=5, seed=1, stop_token_ids=None)
    np.testing.assert_array_equal(sampled["token_ids"], again["token_ids"])


def test_zero_mem_len_is_refused():
    with pytest.raises(ValueError, match="mem_len must be a positive int"):
        _backbone(mem_len=0)


@pytest.mark.parametrize(
    "memory_shape, message",
    [
        ((2, 3, MEM_LEN, 16), "num_layers=2"),
        ((2, 2, MEM_LEN, 8), "hidden_dim=16"),
        ((2, 2, 16), "memory"),
        ((3, 2, MEM_LEN, 16), "batch of 3 sequences"),
    ],
)
def test_memories_of_the_wrong_shape_are_refused(memory_shape, message):
    backbone = _backbone()
    with pytest.raises(ValueError, match=message):
        backbone({"token_ids": _tokens(2, 4), "memory": np.zeros(memory_shape, "float32")})


def test_out_of_range_ids_are_refused_before_the_graph():
    lm = _lm()
    with pytest.raises(ValueError, match="outside the valid range"):
        lm.score(np.array([[1, VOCABULARY_SIZE]]))
    with pytest.raises(ValueError, match="outside the valid range"):
        lm.evaluate(np.array([1, 2, 3, VOCABULARY_SIZE + 4] * 4), batch_size=1, verbose=0)
    with pytest.raises(ValueError, match="outside the valid range"):
        lm.generate({"token_ids": np.array([[VOCABULARY_SIZE]])}, max_new_tokens=2)


def test_token_ids_alone_are_the_token_ids_input():
    lm = _lm()
    tokens = _tokens(2, 5)
    expected = _numpy(lm({"token_ids": tokens, "reset_memory": np.ones((2,), bool)}))
    lm.reset_memory(2)
    np.testing.assert_allclose(_numpy(lm(tokens)), expected, atol=1e-6)
    lm.reset_memory(2)
    np.testing.assert_allclose(_numpy(lm.predict_on_batch(tokens)), expected, atol=1e-5)  # compiled vs eager
    with pytest.raises(ValueError, match="outside the valid range"):
        lm(np.array([[1, VOCABULARY_SIZE]]))


def test_config_round_trip_rebuilds_the_same_model():
    lm = _lm(same_length=False, per_layer_biases=False, norm_first=True)
    ids = _tokens(2, 5)
    run_config_round_trip_test(lm, ids, outputs=lambda model: model.score(ids)["log_probabilities"])


def test_backbone_behaviour(tmp_path):
    arguments = dict(vocabulary_size=VOCABULARY_SIZE, num_layers=1, num_heads=2, hidden_dim=8, head_dim=4,
                     intermediate_dim=16, mem_len=4, cutoffs=[20, 40], div_val=2)

    def inputs(batch, length):
        return {"token_ids": _tokens(batch, length), "memory": np.zeros((batch, 1, 4, 8), "float32")}

    run_backbone_test(
        TransformerXLBackbone, arguments, inputs(2, 5), {"sequence_output": (2, 5, 8), "memory": (2, 1, 4, 8)},
        tmp_path, variable_input_data=[(inputs(3, 7), {"sequence_output": (3, 7, 8), "memory": (3, 1, 4, 8)})],
    )


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_log_probabilities_are_float32_under_a_global_mixed_policy(policy):
    """The adaptive softmax computes in float32; the layer that keeps the
    memory passes its output through without rounding it to the policy's
    compute dtype."""
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        lm = TransformerXLCausalLM(_backbone())
        out = lm({"token_ids": _tokens(1, 4)})
    finally:
        keras.config.set_dtype_policy(previous)
    assert keras.backend.standardize_dtype(out.dtype) == "float32"
    probabilities = np.exp(_numpy(out)).sum(-1)
    np.testing.assert_allclose(probabilities, 1.0, atol=1e-5)  # float32 log-probabilities normalize to float32 accuracy
