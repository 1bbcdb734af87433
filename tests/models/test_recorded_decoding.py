"""The decoding loop's body (model step, sampler, buffer writes) is recorded
whole on torch, once per input signature, and on CUDA replayed as one
captured CUDA graph; a body that branches on a tensor's value runs its
fallback instead of a frozen recording. The generated tokens are checked
against greedy decoding by full forward passes, which no recording touches.

The CUDA tests run only where torch sees a GPU (the device machine; see
docs/benchmarks.md), not in CI, which has none."""

import logging

import keras
import numpy as np
import pytest

import attention_zoo_keras as azk
from attention_zoo_keras.backend_support import compiled_decoding
from attention_zoo_keras.backend_support import cuda_graphs
from attention_zoo_keras.backend_support import recorded_steps
from attention_zoo_keras.generation import beam_search
from attention_zoo_keras.models import causal_lm
from tests.support.devices import needs_cuda
from tests.support.streamers import RecordingStreamer
from tests.support.tiny_models import tiny_gpt

TORCH = keras.backend.backend() == "torch"


PROMPTS = {
    "token_ids": np.array([[5, 6, 7, 8, 0, 0], [9, 3, 2, 1, 4, 11]], dtype="int32"),
    "padding_mask": np.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], dtype=bool),
}


def _tiny_lm():
    keras.utils.set_random_seed(0)
    return azk.models.GPTCausalLM(tiny_gpt(vocabulary_size=97, max_sequence_length=32), preprocessor=None)


def _greedy_by_full_passes(lm, max_length):
    """Greedy continuations of `PROMPTS`, one full eager forward pass per
    token over the row so far, right-padded to `max_length`: the model is
    causal, so its logits at the row's last position do not see the padding
    (and with one input shape JAX compiles its eager operations once)."""
    rows = []
    for ids, mask in zip(PROMPTS["token_ids"], PROMPTS["padding_mask"]):
        row = [int(i) for i in ids[mask]]
        while len(row) < max_length:
            padded = np.zeros((1, max_length), "int32")
            padded[0, : len(row)] = row
            logits = lm({"token_ids": padded, "padding_mask": np.arange(max_length)[None, :] < len(row)})
            row.append(int(np.argmax(keras.ops.convert_to_numpy(logits)[0, len(row) - 1])))
        rows.append(row)
    return rows


def _generate_greedily_three_times(lm):
    """Three `generate` calls of one shape (a recording, then replays), each
    checked against greedy decoding by full forward passes."""
    expected = _greedy_by_full_passes(lm, 20)
    for _ in range(3):
        generated = lm.generate(PROMPTS, max_length=20, stop_token_ids=None)["token_ids"]
        assert [list(row[:20]) for row in generated] == expected


def _on_cuda():
    return keras.ops.convert_to_tensor(0).is_cuda


def _count_calls(monkeypatch, module, name):
    calls = []
    original = getattr(module, name)

    def counted(*args, **kwargs):
        calls.append(kwargs)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


def test_greedy_decoding_equals_full_passes_with_one_recording_per_part_and_cache_size(monkeypatch):
    lm = _tiny_lm()
    monkeypatch.setattr(compiled_decoding, "_GROWTH_PAYS_FROM_SHARE", 0.0)  # a CPU grows any cache
    monkeypatch.setattr(compiled_decoding, "_GROWTH_PAYS_FROM_BYTES", 0)
    monkeypatch.setattr(causal_lm, "PROMPT_MULTIPLE", 1)  # the prompt pass covers the prompt alone
    traces = _count_calls(monkeypatch, recorded_steps, "_jit_trace")
    _generate_greedily_three_times(lm)
    whole_recordings = [call for call in traces if call.get("strict")]  # the prompt pass and the loop's body
    # The buffer holds 32 positions (the model's limit); decoding starts at 4,
    # within one past the prompt pass (4 positions).
    cache_sizes = compiled_decoding.decoding_cache_sizes(keras.ops.zeros((2, 32), "int32"), 5, 1, 1)
    if TORCH and not _on_cuda():
        assert cache_sizes == (16, 32)  # a CPU grows the cache: one body recording per size
    assert len(whole_recordings) == (1 + len(cache_sizes) if TORCH else 0)


@pytest.mark.skipif(not TORCH, reason="recordings exist on torch only")
def test_a_body_that_branches_on_a_value_runs_its_fallback(caplog):
    import torch

    def step(x):
        return x * 2.0 if bool(torch.sum(x) > 0) else x - 1.0  # a trace would freeze one branch

    fallback_calls = []

    def fallback(x):
        fallback_calls.append(x)
        return step(x)

    compiled = recorded_steps.compile_step(step, [], fallback=fallback)
    with caplog.at_level(logging.INFO, logger="attention_zoo_keras"):
        positive = compiled(torch.ones(3))
    negative = compiled(-torch.ones(3))
    np.testing.assert_array_equal(positive.cpu().numpy(), [2.0, 2.0, 2.0])
    np.testing.assert_array_equal(negative.cpu().numpy(), [-2.0, -2.0, -2.0])
    assert len(fallback_calls) == 2
    assert "not recorded whole" in caplog.text


@pytest.mark.skipif(not TORCH, reason="recordings exist on torch only")
def test_a_body_that_branches_on_shapes_only_is_recorded():
    import torch

    def step(x):
        return x * 2.0 if x.shape[0] > 2 else x - 1.0

    compiled = recorded_steps.compile_step(step, [], fallback=lambda x: pytest.fail("fell back"))
    np.testing.assert_array_equal(compiled(torch.ones(3)).cpu().numpy(), [2.0, 2.0, 2.0])
    np.testing.assert_array_equal(compiled(torch.full((3,), 5.0)).cpu().numpy(), [10.0, 10.0, 10.0])
    assert len(compiled.signatures) == 1


@pytest.mark.skipif(not TORCH, reason="recordings exist on torch only")
@pytest.mark.parametrize("compile_program", [False, True], ids=["traced", "compiled"])
def test_one_tensor_given_as_two_arguments_is_recorded_as_two(compile_program):
    """A beam search starts its finished beams as its running ones: the
    recording must keep them two inputs, which later calls give apart."""
    import torch

    compiled = recorded_steps.compile_step(lambda a, b: a * 10.0 + b, [], compile_program=compile_program)
    same = torch.ones(2)
    np.testing.assert_array_equal(compiled(same, same).cpu().numpy(), [11.0, 11.0])
    np.testing.assert_array_equal(compiled(torch.ones(2), torch.full((2,), 5.0)).cpu().numpy(), [15.0, 15.0])


@pytest.mark.parametrize(
    "family", ["gpt_greedy", "gpt", "gpt_linear_attention", "transformer_xl", "reformer", "seq2seq"]
)
def test_jit_compiled_generation_gives_the_tokens_of_the_default_one(family):
    """`compile(jit_compile=True)` on a CPU: two calls (a recording, then a
    replay) give the default `generate`'s tokens, in beam search (whose
    loop state holds one tensor twice) for every family."""
    keras.utils.set_random_seed(0)
    task, prompts, options = _generative_families()[family.removesuffix("_greedy")]()
    options = {**options, **({} if family.endswith("_greedy") else {"num_beams": 2})}
    expected = task.generate(prompts, **options)["token_ids"]
    task.compile(jit_compile=True)
    for _ in range(2):
        np.testing.assert_array_equal(task.generate(prompts, **options)["token_ids"], expected)


@pytest.mark.skipif(keras.backend.backend() == "tensorflow",
                    reason="TensorFlow's compiled loop tests its condition at every step, on every device")
@pytest.mark.parametrize("sampler", ["greedy", "top_k"])
def test_testing_the_stop_condition_every_few_steps_gives_the_same_tokens(monkeypatch, sampler):
    """On a GPU the loop tests whether every row is done only every few
    steps (torch: a Python loop running on past the end; JAX: a compiled
    loop of fixed-count blocks, then single steps up to the buffer's end);
    here, on a CPU, it is made to. Lengths 24 and 25 leave different
    remainders of single steps."""
    stop_id = None
    for max_length in (24, 25):
        lm = _tiny_lm()
        options = dict(max_length=max_length, sampler=sampler, seed=3)
        unstopped = lm.generate(PROMPTS, stop_token_ids=None, **options)
        if stop_id is None:  # row 0 stops at its first one; row 1 at its own, or at the end
            stop_id = int(unstopped["token_ids"][0, 14])
        expected = lm.generate(PROMPTS, stop_token_ids=[stop_id], **options)
        assert expected["padding_mask"][0].sum() <= 15  # row 0 did stop early
        tests = []

        def every_third_step(loop_vars):
            tests.append(loop_vars)
            return 3

        with monkeypatch.context() as patches:
            patches.setattr(compiled_decoding, "_steps_between_tests", every_third_step)
            lm = _tiny_lm()  # (a new model: JAX compiles the loop again)
            chunked = lm.generate(PROMPTS, stop_token_ids=[stop_id], **options)
            chunked_unstopped = lm.generate(PROMPTS, stop_token_ids=None, **options)
        assert tests  # the chunked loop ran
        for name in ("token_ids", "padding_mask"):
            np.testing.assert_array_equal(chunked[name], expected[name])
            np.testing.assert_array_equal(chunked_unstopped[name], unstopped[name])


@pytest.mark.skipif(keras.backend.backend() == "tensorflow",
                    reason="TensorFlow's compiled loop tests its condition at every step, on every device")
def test_a_stream_testing_its_condition_every_few_steps_gives_the_same_chunks(monkeypatch):
    """A stream's chunks end at positions the loop must not run past (each
    chunk is a loop up to its end): tested every 3 steps, the chunks are
    those of a loop tested at every step."""
    prompt = {name: value[:1, :4] for name, value in PROMPTS.items()}
    expected = RecordingStreamer()
    _tiny_lm().generate(prompt, max_length=30, stop_token_ids=None, streamer=expected)
    chunked = RecordingStreamer()
    with monkeypatch.context() as patches:
        patches.setattr(compiled_decoding, "_steps_between_tests", lambda loop_vars: 3)
        _tiny_lm().generate(prompt, max_length=30, stop_token_ids=None, streamer=chunked)
    assert len(expected.puts) > 3 and chunked.ended
    assert chunked.puts == expected.puts


@needs_cuda
def test_cuda_greedy_decoding_replays_one_captured_graph(monkeypatch):
    lm = _tiny_lm()
    captures = _count_calls(monkeypatch, cuda_graphs, "GraphReplay")
    _generate_greedily_three_times(lm)
    assert len(captures) == 1


@needs_cuda
@pytest.mark.parametrize("sampler", ["top_k", "top_p", "temperature"])
def test_cuda_sampling_gives_the_uncaptured_tokens(monkeypatch, sampler):
    lm = _tiny_lm()
    captured = lm.generate(PROMPTS, max_length=24, sampler=sampler, seed=3, stop_token_ids=None)["token_ids"]
    monkeypatch.setattr(recorded_steps, "captured_or_plain", lambda program, num_persistent, inputs: program)
    lm = _tiny_lm()
    plain = lm.generate(PROMPTS, max_length=24, sampler=sampler, seed=3, stop_token_ids=None)["token_ids"]
    np.testing.assert_array_equal(captured, plain)


@needs_cuda
def test_cuda_compiled_generation_gives_the_same_tokens_at_every_call_and_batch_size():
    """`compile(jit_compile=True)`: the loop's body compiled by inductor and
    captured; two batch sizes (two programs), three calls each."""
    lm = _tiny_lm()
    expected = lm.generate(PROMPTS, max_length=20, stop_token_ids=None)["token_ids"]
    lm.compile(jit_compile=True)
    for rows in (2, 1, 2, 1, 2, 1):
        prompts = {name: value[:rows] for name, value in PROMPTS.items()}
        generated = lm.generate(prompts, max_length=20, stop_token_ids=None)["token_ids"]
        np.testing.assert_array_equal(generated, expected[:rows])


@needs_cuda
def test_cuda_beam_search_reordering_caches_in_place_gives_the_tokens_of_a_take(monkeypatch):
    """On CUDA the beams' caches are reordered in place inside the captured
    graph; the tokens must be those of the functional reordering, uncaptured."""
    lm = _tiny_lm()
    captured = lm.generate(PROMPTS, max_length=20, num_beams=3, stop_token_ids=None)["token_ids"]
    monkeypatch.setattr(recorded_steps, "captured_or_plain", lambda program, num_persistent, inputs: program)
    monkeypatch.setattr(beam_search, "reorder_rows", lambda buffer, rows: keras.ops.take(buffer, rows, axis=0))
    lm = _tiny_lm()
    plain = lm.generate(PROMPTS, max_length=20, num_beams=3, stop_token_ids=None)["token_ids"]
    np.testing.assert_array_equal(captured, plain)


@needs_cuda
def test_graph_replay_returns_written_inputs_as_its_buffers_and_clones_the_rest():
    import torch

    weight = torch.arange(4.0, device="cuda")

    def program(inputs):
        weight, row, cache = inputs
        cache.index_copy_(0, row, (weight * row.float())[None, :])
        return [cache, cache.sum(dim=0)]

    cache = torch.zeros(3, 4, device="cuda")
    replay = cuda_graphs.GraphReplay(program, 1, [weight, torch.tensor([1], device="cuda"), cache])
    cache_out, total = replay([weight, torch.tensor([2], device="cuda"), cache])
    assert cache_out.data_ptr() != cache.data_ptr()  # the graph's own buffer, filled from `cache`
    cache_again, total_again = replay([weight, torch.tensor([0], device="cuda"), cache_out])
    assert cache_again.data_ptr() == cache_out.data_ptr()  # fed back: no copy
    np.testing.assert_array_equal(total.cpu().numpy(), (2 * np.arange(4.0)).tolist())  # kept after the next call
    np.testing.assert_array_equal(cache_again[2].cpu().numpy(), 2 * np.arange(4.0))
    np.testing.assert_array_equal(cache_again[1].cpu().numpy(), np.zeros(4))  # the capture's writes were replaced


def _prompts(batch=2, length=4, vocabulary=20):
    return np.arange(5, 5 + batch * length, dtype="int32").reshape(batch, length) % vocabulary + 3


def _generative_families():
    """`{name: () -> (task, prompts, generate options)}`, tiny, one per
    generative family (and linear attention's recurrent cache)."""
    causal = dict(max_new_tokens=6, stop_token_ids=None)
    return {
        "gpt": lambda: (azk.models.GPTCausalLM(tiny_gpt(vocabulary_size=97, max_sequence_length=32),
                                               preprocessor=None), PROMPTS, causal),
        "gpt_linear_attention": lambda: (
            azk.models.GPTCausalLM(tiny_gpt(attention="linear", attention_dropout=0.0, vocabulary_size=97,
                                            max_sequence_length=32), preprocessor=None), PROMPTS, causal),
        "transformer_xl": lambda: (
            azk.models.TransformerXLCausalLM(azk.models.TransformerXLBackbone(
                vocabulary_size=40, num_layers=1, num_heads=2, hidden_dim=8, head_dim=4, intermediate_dim=16,
                mem_len=8, cutoffs=[10, 20], div_val=2, dropout=0.0)),
            {"token_ids": _prompts()}, causal),
        "reformer": lambda: (
            azk.models.ReformerCausalLM(azk.models.ReformerBackbone(
                vocabulary_size=40, hidden_dim=8, num_heads=2, head_dim=4, intermediate_dim=16,
                attention=["local", "lsh"],
                attention_options={"lsh": {"num_hashes": 1, "num_buckets": 2, "chunk_length": 4},
                                   "local": {"block_size": 4}},
                axial_pos_shape=(4, 8), axial_pos_embds_dim=(4, 4), dropout=0.0, attention_dropout=0.0, seed=1),
                preprocessor=None),
            {"token_ids": _prompts()}, causal),
        "seq2seq": lambda: (
            azk.models.TransformerSeq2SeqLM(azk.models.TransformerBackbone(
                vocabulary_size=30, num_encoder_layers=1, num_decoder_layers=1, num_heads=2, hidden_dim=8,
                intermediate_dim=16, max_sequence_length=16, dropout=0.0, attention_dropout=0.0)),
            {"encoder_token_ids": _prompts(length=5), "encoder_padding_mask": np.ones((2, 5), "int32")},
            dict(max_length=8, decoder_start_token_id=1, stop_token_ids=None)),
    }


@pytest.mark.skipif(not TORCH, reason="only torch records: JAX and TensorFlow compile the whole loop either way")
@pytest.mark.parametrize("family", sorted(_generative_families()))
@pytest.mark.parametrize("decoding", [{}, {"sampler": "top_p", "p": 0.9, "seed": 3}, {"num_beams": 2}],
                         ids=["greedy", "top_p", "beam"])
def test_every_family_generates_the_tokens_of_its_eager_loop(monkeypatch, family, decoding):
    keras.utils.set_random_seed(0)
    lm, prompts, options = _generative_families()[family]()
    recorded = [lm.generate(prompts, **options, **decoding)["token_ids"] for _ in range(2)]  # records, replays
    monkeypatch.setattr(azk.models.generative_task.GenerativeTask, "_recorded_body",
                        lambda self, make_body: make_body(self._decoding_step(recorded=False)))
    monkeypatch.setattr(azk.models.generative_task.GenerativeTask, "_recorded_start",
                        lambda self, beams: lambda inputs, ids, start: self._start_decoding(inputs, ids, start, beams))
    lm.__dict__.pop("_generation_functions", None)
    eager = lm.generate(prompts, **options, **decoding)["token_ids"]
    for tokens in recorded:
        np.testing.assert_array_equal(tokens, eager)
