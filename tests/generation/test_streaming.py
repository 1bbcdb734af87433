"""Streaming `generate` (issue 25): on every generative task and backend, the
pieces handed out while the compiled loop runs join to the text `generate`
returns, for every sampler and for beam search; characters split across
tokens (byte-level BPE, byte tokenizers) come out whole; a streamer gets
the prompt's ids, then the new ones, then `end()`."""

import keras
import numpy as np
import pytest

import attention_zoo_keras as azk
from attention_zoo_keras.generation.streaming import IncrementalText
from attention_zoo_keras.generation.streaming import chunk_ends
from attention_zoo_keras.models.reformer import ReformerByteTokenizer
from tests.support.streamers import RecordingStreamer

TEXTS = ["naïve café 東京", "ab"]


def _randomized(model, seed=0):
    """Weights drawn in numpy, the same on every backend, large enough that
    generation wanders over the whole vocabulary (so multi-byte characters
    get split)."""
    rng = np.random.default_rng(seed)
    for variable in model.weights:
        variable.assign(rng.normal(0.0, 0.5, variable.shape).astype(variable.dtype))
    return model


@pytest.fixture(scope="module")
def lm(tiny_gpt2_checkpoints):
    """GPT-2 with a byte-level BPE trained on text with multi-byte characters."""
    return _randomized(azk.models.GPTCausalLM.from_preset(str(tiny_gpt2_checkpoints["lm"])))


def _reformer():
    backbone = azk.models.ReformerBackbone(
        vocabulary_size=258, hidden_dim=8, num_heads=2, head_dim=4, intermediate_dim=16, attention="local",
        num_layers=2, attention_options={"local": {"block_size": 8}}, axial_pos_shape=(8, 8),
        axial_pos_embds_dim=(4, 4), dropout=0.0, attention_dropout=0.0,
    )
    preprocessor = azk.models.ReformerCausalLMPreprocessor(ReformerByteTokenizer(), sequence_length=64)
    return _randomized(azk.models.ReformerCausalLM(backbone, preprocessor))


def _transformer_xl():
    words = ["<eos>", "<unk>", "naïve", "café", "東京", "ab", "the", "cat"]
    backbone = azk.models.TransformerXLBackbone(
        vocabulary_size=len(words), num_layers=1, num_heads=2, hidden_dim=8, head_dim=4, intermediate_dim=16,
        mem_len=4, cutoffs=[], div_val=1, dropout=0.0,
    )
    tokenizer = azk.models.TransformerXLTokenizer.from_vocabulary(words)
    preprocessor = azk.models.TransformerXLCausalLMPreprocessor(tokenizer, sequence_length=32)
    return _randomized(azk.models.TransformerXLCausalLM(backbone, preprocessor))


def _seq2seq():
    tokenizer = azk.models.TransformerTokenizer.from_characters(TEXTS)
    backbone = azk.models.TransformerBackbone(
        vocabulary_size=tokenizer.vocabulary_size, num_encoder_layers=1, num_decoder_layers=1, num_heads=2,
        hidden_dim=8, intermediate_dim=16, max_sequence_length=32, dropout=0.0,
    )
    preprocessor = azk.models.TransformerSeq2SeqLMPreprocessor(tokenizer, 16, 16)
    return _randomized(azk.models.TransformerSeq2SeqLM(backbone, preprocessor))


def _task(name, request):
    if name == "gpt":
        return request.getfixturevalue("lm")
    return {"reformer": _reformer, "transformer_xl": _transformer_xl, "seq2seq": _seq2seq}[name]()


GREEDY = {}
TOP_P = {"sampler": "top_p", "p": 0.9, "temperature": 1.5, "seed": 3}
TOP_K = {"sampler": "top_k", "k": 5, "seed": 4}
BEAM = {"num_beams": 3}


# Every sampler on one family, and every family (each with its own decoding
# cache and hooks) with a sampler: the streaming code is shared.
@pytest.mark.parametrize(
    "name, options",
    [("gpt", GREEDY), ("gpt", TOP_P), ("gpt", TOP_K), ("gpt", BEAM), ("reformer", GREEDY),
     ("transformer_xl", TOP_K), ("seq2seq", TOP_P)],
    ids=["gpt-greedy", "gpt-top_p", "gpt-top_k", "gpt-beam", "reformer-greedy", "transformer_xl-top_k",
         "seq2seq-top_p"],
)
def test_streamed_pieces_join_to_the_output(name, options, request):
    task = _task(name, request)
    arguments = {"max_new_tokens": 12, "stop_token_ids": None, **options}
    expected = task.generate(TEXTS, **arguments)
    pieces = list(task.generate(TEXTS, stream=True, **arguments))
    assert all(isinstance(piece, list) and len(piece) == len(TEXTS) for piece in pieces)
    assert ["".join(piece[row] for piece in pieces) for row in range(len(TEXTS))] == expected
    if options is not BEAM:  # handed out as it decodes: more than the prompt, then the end
        assert len(pieces) > 2


def test_one_prompt_streams_strings(lm):
    single = list(lm.generate(TEXTS[0], max_new_tokens=12, stop_token_ids=None, stream=True))
    assert all(isinstance(piece, str) for piece in single)
    assert "".join(single) == lm.generate(TEXTS[0], max_new_tokens=12, stop_token_ids=None)


def test_byte_level_pieces_join_to_the_output_for_random_continuations(lm):
    """Byte-level BPE with random weights: tokens holding parts of
    characters come in any order and chunk; each piece is the text that
    the row's tokens so far have fixed, so the pieces join to the output
    (a piece cut inside a character would leave a replacement character
    where the output has the character; `IncrementalText`'s own test
    splits one on purpose)."""
    for seed in range(3):
        arguments = {"max_new_tokens": 14, "stop_token_ids": None, "sampler": "top_k", "k": 50, "seed": seed}
        pieces = list(lm.generate(TEXTS[0], stream=True, **arguments))
        assert "".join(pieces) == lm.generate(TEXTS[0], **arguments)


def test_incremental_text_holds_back_unfinished_characters():
    def decode(ids):  # ids are bytes
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")

    data = list("a東京b".encode())  # 東 and 京 are 3 bytes each
    text, pieces = IncrementalText(decode), []
    for end in range(1, len(data) + 1):
        pieces.append(text.piece(np.array(data[:end])))
    pieces.append(text.piece(np.array(data), final=True))
    assert "".join(pieces) == "a東京b"
    assert pieces[:5] == ["a", "", "", "東", ""]
    # A text ending in bytes that never form a character is handed out at the end.
    broken = IncrementalText(decode)
    assert broken.piece(np.array([97, 0xE6])) == "a"
    assert broken.piece(np.array([97, 0xE6]), final=True) == "\ufffd"


def test_chunks_grow_to_the_largest_and_end_at_the_buffer():
    assert list(chunk_ends(3, 4)) == [4]
    ends = list(chunk_ends(0, 100))
    assert ends[:5] == [1, 3, 7, 15, 31] and ends[-1] == 100
    assert max(b - a for a, b in zip(ends, ends[1:])) == 16


def test_a_streamer_gets_the_prompt_then_the_new_tokens(lm):
    prompt = lm.preprocessor.tokenizer.encode([TEXTS[0]])[0]
    streamer = RecordingStreamer()
    output = lm.generate({"token_ids": np.array([prompt]), "padding_mask": np.ones((1, len(prompt)), "int32")},
                         max_new_tokens=10, stop_token_ids=None, streamer=streamer)
    assert streamer.ended and streamer.puts[0] == prompt and len(streamer.puts) > 2
    assert sum(streamer.puts, []) == output["token_ids"][0][output["padding_mask"][0].astype(bool)].tolist()


def test_closing_the_stream_stops_it_and_leaves_the_model_usable(lm):
    stream = lm.generate(TEXTS[0], max_new_tokens=14, stop_token_ids=None, stream=True)
    first = next(stream)
    stream.close()
    with pytest.raises(StopIteration):
        next(stream)
    assert lm.generate(TEXTS[0], max_new_tokens=14, stop_token_ids=None).startswith(first)


def test_streaming_compiles_each_program_once(tiny_gpt2_checkpoints, monkeypatch):
    """Chunks of every size run one compiled program: a second stream of the
    same shapes traces nothing (under torch the loop's step runs eagerly,
    so there is nothing to count)."""
    if keras.backend.backend() == "torch":
        pytest.skip("torch runs the loop eagerly: every step calls the model's step")
    fresh = azk.models.GPTCausalLM.from_preset(str(tiny_gpt2_checkpoints["lm"]))
    calls = []
    original = fresh._next_token_logits

    def counting(*args):
        calls.append(1)
        return original(*args)

    monkeypatch.setattr(fresh, "_next_token_logits", counting)
    list(fresh.generate(TEXTS[0], max_new_tokens=14, stop_token_ids=None, stream=True))
    traced = len(calls)
    assert traced > 0
    list(fresh.generate(TEXTS[0], max_new_tokens=14, stop_token_ids=None, stream=True))
    assert len(calls) == traced


def test_streaming_errors_name_the_problem(lm):
    with pytest.raises(TypeError, match="put.*end"):
        lm.generate(TEXTS[0], max_new_tokens=2, streamer=object())
    with pytest.raises(ValueError, match="one prompt"):
        lm.generate(TEXTS, max_new_tokens=2, streamer=RecordingStreamer())
    with pytest.raises(ValueError, match="not both"):
        lm.generate(TEXTS[0], max_new_tokens=2, streamer=RecordingStreamer(), stream=True)
    prompts = {"token_ids": np.array([[5, 6]]), "padding_mask": np.ones((1, 2), "int32")}
    with pytest.raises(ValueError, match="streams text"):
        lm.generate(prompts, max_new_tokens=2, stream=True)
