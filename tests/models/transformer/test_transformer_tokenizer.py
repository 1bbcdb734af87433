"""`TransformerTokenizer` against `transformers.MarianTokenizer` (the slow,
`sentencepiece`-based one) on a tiny Marian checkpoint's files; the
SentencePiece model reader against `sentencepiece`; saving and loading."""

import json
import random
import re
import warnings

import numpy as np
import pytest
import tokenizers

from attention_zoo_keras.hub import PresetFileError
from attention_zoo_keras.hub import PresetSource
from attention_zoo_keras.models.transformer import TransformerBackbone
from attention_zoo_keras.models.transformer import TransformerSeq2SeqLMPreprocessor
from attention_zoo_keras.models.transformer import TransformerTokenizer
from attention_zoo_keras.tokenizers.sentencepiece_model import CONTROL
from attention_zoo_keras.tokenizers.sentencepiece_model import NORMAL
from attention_zoo_keras.tokenizers.sentencepiece_model import UNKNOWN
from attention_zoo_keras.tokenizers.sentencepiece_model import read_sentencepiece_model
from attention_zoo_keras.tokenizers.sentencepiece_model import unigram_tokenizer
from tests.support.marian_texts import TEXTS
from tests.support.tiny_checkpoints import SOURCE_CORPUS
from tests.support.tiny_checkpoints import TARGET_CORPUS

sentencepiece = pytest.importorskip("sentencepiece")
transformers = pytest.importorskip("transformers")

@pytest.fixture(scope="module")
def marian(tiny_marian_tokenizer_files):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Recommended: pip install sacremoses."
        return transformers.MarianTokenizer.from_pretrained(str(tiny_marian_tokenizer_files))


@pytest.fixture(scope="module")
def tokenizer(tiny_marian_tokenizer_files):
    files = tiny_marian_tokenizer_files
    return TransformerTokenizer.from_marian(files / "source.spm", files / "target.spm", files / "vocab.json")


# --- ids and text as MarianTokenizer gives them ------------------------------


def test_source_ids_match_marian_tokenizer(tokenizer, marian, tiny_marian_tokenizer_files):
    # The source piece the vocabulary leaves out must come out as <unk>.
    vocabulary = json.loads((tiny_marian_tokenizer_files / "vocab.json").read_text(encoding="utf-8"))
    source = sentencepiece.SentencePieceProcessor(model_file=str(tiny_marian_tokenizer_files / "source.spm"))
    left_out = [
        source.id_to_piece(i) for i in range(source.get_piece_size())
        if not source.is_control(i) and not source.is_unknown(i) and source.id_to_piece(i) not in vocabulary
    ]
    assert len(left_out) == 1
    texts = TEXTS + [left_out[0].replace("▁", " ")]

    expected = [marian(text, add_special_tokens=False)["input_ids"] for text in texts]

    assert tokenizer.encode(texts) == expected
    assert tokenizer.unknown_token_id in expected[-1]


def test_target_ids_match_marian_tokenizer(tokenizer, marian):
    expected = [marian(text_target=text, add_special_tokens=False)["input_ids"] for text in TEXTS]

    assert tokenizer.encode_target(TEXTS) == expected
    assert tokenizer.encode_target(TEXTS) != tokenizer.encode(TEXTS)  # two different models


def test_marian_tokenizer_appends_only_the_end_token(tokenizer, marian):
    texts = ["The fox sat.", ">>de<< The fox", ""]
    expected = [ids + [tokenizer.end_token_id] for ids in tokenizer.encode(texts)]
    assert [marian(text)["input_ids"] for text in texts] == expected


def test_special_token_ids_and_vocabulary_match(tokenizer, marian):
    assert tokenizer.end_token_id == marian.eos_token_id == 0
    assert tokenizer.unknown_token_id == marian.unk_token_id == 1
    assert tokenizer.pad_token_id == marian.pad_token_id == tokenizer.vocabulary_size - 1
    assert tokenizer.vocabulary_size == marian.vocab_size
    assert tokenizer.vocabulary == marian.get_vocab()
    assert tokenizer.token_to_id(">>el<<") == marian.convert_tokens_to_ids(">>el<<")
    assert tokenizer.id_to_token(5) == marian.convert_ids_to_tokens(5)


def test_decode_matches_marian_tokenizer(tokenizer, marian):
    sequences = tokenizer.encode_target(TEXTS) + tokenizer.encode(TEXTS)
    end, unknown, pad = tokenizer.special_token_ids
    sequences.append([end, *sequences[0], unknown, *sequences[1], pad])

    for ids in sequences:
        expected = marian.decode(ids, skip_special_tokens=True, use_source_tokenizer=False)
        assert tokenizer.decode(ids) == expected, ids
        # transformers 5 decodes with the source model by default; the same text.
        assert marian.decode(ids, skip_special_tokens=True) == expected


def test_decode_keeping_special_tokens_matches_marian_tokenizer(tokenizer, marian):
    first, second = tokenizer.encode_target(TARGET_CORPUS[:2])
    ids = [*first, tokenizer.end_token_id, tokenizer.unknown_token_id, *second, tokenizer.pad_token_id]

    decoded = tokenizer.decode(ids, skip_special_tokens=False)

    assert decoded == marian.decode(ids, skip_special_tokens=False, use_source_tokenizer=False)
    assert "</s> <unk>" in decoded


def test_decode_takes_numpy_ids_and_refuses_unknown_ones(tokenizer):
    ids = np.array(tokenizer.encode_target(["Der Hund"])[0], dtype="int32")
    assert tokenizer.decode(ids) == "Der Hund"
    with pytest.raises(ValueError, match=r"Token id 1000 is outside the vocabulary \(0\.\.\d+\)"):
        tokenizer.decode([1000])


# --- the SentencePiece model reader ------------------------------------------


@pytest.mark.parametrize("side", ["source", "target"])
def test_model_file_is_read_as_sentencepiece_reads_it(tiny_marian_tokenizer_files, side):
    path = tiny_marian_tokenizer_files / f"{side}.spm"
    processor = sentencepiece.SentencePieceProcessor(model_file=str(path))

    model = read_sentencepiece_model(path)

    assert len(model.pieces) == processor.get_piece_size()
    for index, piece in enumerate(model.pieces):
        assert piece.piece == processor.id_to_piece(index)
        assert np.float32(piece.score) == np.float32(processor.get_score(index))
        expected_type = UNKNOWN if processor.is_unknown(index) else CONTROL if processor.is_control(index) else NORMAL
        assert piece.type == expected_type
    assert model.unknown_id == processor.unk_id()
    assert (model.model_type, model.normalizer_name) == (1, "nmt_nfkc")
    assert len(model.precompiled_charsmap) > 1000
    assert model.add_dummy_prefix and model.remove_extra_whitespaces and model.split_by_whitespace
    assert not model.byte_fallback


@pytest.mark.parametrize("side", ["source", "target"])
def test_unigram_tokenizer_segments_as_sentencepiece(tiny_marian_tokenizer_files, side):
    path = tiny_marian_tokenizer_files / f"{side}.spm"
    processor = sentencepiece.SentencePieceProcessor(model_file=str(path))
    tokenizer = unigram_tokenizer(read_sentencepiece_model(path))
    texts = TEXTS + ["x<unk>y", "<s> and </s>"]  # control pieces are never matched

    for text in texts:
        encoding = tokenizer.encode(text)
        assert encoding.tokens == processor.encode(text, out_type=str), text
        assert encoding.ids == processor.encode(text), text
    for text in SOURCE_CORPUS if side == "source" else TARGET_CORPUS:
        assert tokenizer.decode(processor.encode(text)) == processor.decode(processor.encode(text)) == text


def _write(directory, name, data):
    path = directory / name
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    "corrupt, reason",
    [
        (lambda data: data[: len(data) // 2], "runs past the end"),
        (lambda data: data[: 2 + data[1]], r"lacks the trainer or normalizer spec \(is it truncated\?\)"),
        (lambda data: b"", "lacks the trainer or normalizer spec"),
        (lambda data: b'{"model": "not a protobuf"}', "unknown wire type"),
        (lambda data: bytes(random.Random(0).randrange(256) for _ in range(4096)), ""),
    ],
    ids=["cut-inside-a-field", "cut-after-the-first-piece", "empty", "json", "random-bytes"],
)
def test_corrupt_model_file_raises_naming_the_file(tiny_marian_tokenizer_files, tmp_path, corrupt, reason):
    data = (tiny_marian_tokenizer_files / "source.spm").read_bytes()
    assert data[0] == 0x0A and data[1] < 0x80  # field 1 (a piece), its length in one byte
    path = _write(tmp_path, "source.spm", corrupt(data))

    message = rf"'{re.escape(str(path))}' is not a valid SentencePiece model: .*{reason}"
    with pytest.raises(PresetFileError, match=message):
        read_sentencepiece_model(path)
    files = tiny_marian_tokenizer_files
    with pytest.raises(PresetFileError, match=message):
        TransformerTokenizer.from_marian(path, files / "target.spm", files / "vocab.json")


def test_missing_model_file_raises_naming_the_file(tmp_path):
    path = tmp_path / "nowhere.spm"
    with pytest.raises(PresetFileError, match=rf"Cannot read the SentencePiece model '{re.escape(str(path))}'"):
        read_sentencepiece_model(path)


def test_bpe_model_is_refused(tiny_marian_tokenizer_files, tmp_path):
    model = tmp_path / "bpe"
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(SOURCE_CORPUS * 3), model_prefix=str(model), vocab_size=80,
        model_type="bpe", num_threads=1, minloglevel=2,
    )
    with pytest.raises(ValueError, match=r"bpe\.model': Only unigram SentencePiece models are supported.*is BPE"):
        TransformerTokenizer.from_marian(
            f"{model}.model", tiny_marian_tokenizer_files / "target.spm", tiny_marian_tokenizer_files / "vocab.json"
        )


def test_vocabulary_without_special_tokens_or_as_bad_json_is_refused(tiny_marian_tokenizer_files, tmp_path):
    files = tiny_marian_tokenizer_files
    vocabulary = json.loads((files / "vocab.json").read_text(encoding="utf-8"))
    del vocabulary["<pad>"]
    with pytest.raises(ValueError, match=r"needs the tokens \['<pad>'\]"):
        TransformerTokenizer.from_marian(files / "source.spm", files / "target.spm", vocabulary)
    with pytest.raises(ValueError, match=r"ids must be 0\.\.2, each once"):
        TransformerTokenizer.from_marian(
            files / "source.spm", files / "target.spm", {"</s>": 0, "<unk>": 1, "<pad>": 3}
        )
    broken = _write(tmp_path, "vocab.json", b'{"</s>": 0,')
    with pytest.raises(PresetFileError, match=rf"'{re.escape(str(broken))}' is not a readable vocabulary JSON file"):
        TransformerTokenizer.from_marian(files / "source.spm", files / "target.spm", broken)


# --- saving and loading ------------------------------------------------------


def test_save_and_read_back_from_a_directory(tokenizer, tmp_path):
    tokenizer.save(tmp_path)
    names = sorted(path.name for path in tmp_path.iterdir())
    # Marian's SentencePiece models travel along, for export_to_transformers.
    assert names == ["source.spm", "target.spm", "target_tokenizer.json", "tokenizer.json", "vocab.json"]

    reloaded = TransformerTokenizer.from_source(PresetSource(tmp_path))
    assert reloaded.sentencepiece_models == tokenizer.sentencepiece_models is not None

    assert reloaded.encode(TEXTS) == tokenizer.encode(TEXTS)
    assert reloaded.encode_target(TEXTS) == tokenizer.encode_target(TEXTS)
    assert reloaded.vocabulary == tokenizer.vocabulary
    # tokenizer.json is the `tokenizers` format: the source model, with SentencePiece's ids.
    source = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert source.encode("The fox").tokens == tokenizer.backend.encode("The fox").tokens


def test_missing_target_tokenizer_file_is_named(tokenizer, tmp_path):
    tokenizer.save(tmp_path)
    (tmp_path / "target_tokenizer.json").unlink()

    with pytest.raises(PresetFileError, match=r"has no 'target_tokenizer\.json'"):
        TransformerTokenizer.from_source(PresetSource(tmp_path))


def _native_preset(tokenizer, directory):
    """A tiny backbone's preset with a preprocessor's files beside it; returns the preprocessor."""
    backbone = TransformerBackbone(
        vocabulary_size=tokenizer.vocabulary_size, num_encoder_layers=1, num_decoder_layers=1,
        num_heads=2, hidden_dim=8, intermediate_dim=16, max_sequence_length=32,
    )
    backbone.save_to_preset(directory)
    preprocessor = TransformerSeq2SeqLMPreprocessor(
        tokenizer, encoder_sequence_length=24, decoder_sequence_length=20, decoder_start_token_id=3
    )
    preprocessor.save_to_preset(directory)
    return preprocessor


def _assert_same_preprocessing(reloaded, original):
    pairs = (list(TEXTS[:40]), list(TEXTS[40:80]))
    for key, value in original(pairs)[0].items():
        np.testing.assert_array_equal(reloaded(pairs)[0][key], value)
    assert reloaded.get_config() == original.get_config()
    assert reloaded.tokenizer.encode(TEXTS) == original.tokenizer.encode(TEXTS)
    assert reloaded.tokenizer.encode_target(TEXTS) == original.tokenizer.encode_target(TEXTS)


def test_preset_round_trip_keeps_both_tokenizers(tokenizer, tmp_path):
    original = _native_preset(tokenizer, tmp_path)
    names = {path.name for path in tmp_path.iterdir()}
    assert {"preprocessor.json", "tokenizer.json", "target_tokenizer.json", "vocab.json"} <= names

    reloaded = TransformerSeq2SeqLMPreprocessor.from_preset(str(tmp_path))

    _assert_same_preprocessing(reloaded, original)
    assert reloaded.decoder_start_token_id == 3


def test_preset_loads_from_the_hub(tokenizer, tmp_path, local_hub):
    original = _native_preset(tokenizer, tmp_path / "preset")
    local_hub.add_repo("zoo-org/tiny-marian-native", tmp_path / "preset")

    reloaded = TransformerSeq2SeqLMPreprocessor.from_preset("hf://zoo-org/tiny-marian-native")

    _assert_same_preprocessing(reloaded, original)
    for name in ("tokenizer.json", "target_tokenizer.json", "vocab.json"):
        assert local_hub.downloads_of(name) == 1


# --- characters, for models trained from scratch -----------------------------

DATES = ["Friday, the 5th of March 2021", "03/05/2021", "5 Mar 2021"]
ISO_DATES = ["2021-03-05", "1999-12-31"]


def test_from_characters_gives_one_id_per_character_on_both_sides():
    tokenizer = TransformerTokenizer.from_characters(DATES + ISO_DATES)
    characters = sorted(set("".join(DATES + ISO_DATES)))

    assert tokenizer.special_token_ids == (0, 1, 2)
    assert tokenizer.vocabulary == {token: i for i, token in enumerate(["</s>", "<unk>", "<pad>", *characters])}
    assert TransformerTokenizer.from_characters(list(reversed(DATES + ISO_DATES))).vocabulary == tokenizer.vocabulary
    assert TransformerTokenizer.from_characters("".join(characters)).vocabulary == tokenizer.vocabulary
    texts = [*DATES, "  two  spaces ", "new\nline", "unseen: дж 😀 é", "a </s> and <pad> and <unk>", ""]
    expected = [[tokenizer.vocabulary.get(c, tokenizer.unknown_token_id) for c in text] for text in texts[:-2]]
    expected += [tokenizer.encode(["a "])[0] + [0] + tokenizer.encode([" and "])[0] + [2]
                 + tokenizer.encode([" and "])[0] + [1], []]
    assert tokenizer.encode(texts) == tokenizer.encode_target(texts) == expected
    for text in DATES + ISO_DATES + ["  March  2021 "]:
        assert tokenizer.decode(tokenizer.encode_target([text])[0] + [tokenizer.end_token_id]) == text.strip()


@pytest.mark.parametrize(
    "characters, error, message",
    [("", ValueError, "holds no character"), ([], ValueError, "holds no character"),
     (["ab", 3], TypeError, "a string or a list of strings")],
)
def test_from_characters_refuses_no_characters_and_non_strings(characters, error, message):
    with pytest.raises(error, match=message):
        TransformerTokenizer.from_characters(characters)


def test_character_tokenizer_files_are_the_tokenizers_format(tmp_path):
    tokenizer = TransformerTokenizer.from_characters(DATES + ISO_DATES)
    tokenizer.save(tmp_path)

    for name in ("tokenizer.json", "target_tokenizer.json"):
        backend = tokenizers.Tokenizer.from_file(str(tmp_path / name))
        assert backend.encode("5 May", add_special_tokens=False).ids == tokenizer.encode(["5 May"])[0]
    reloaded = TransformerTokenizer.from_source(PresetSource(tmp_path))
    assert reloaded.vocabulary == tokenizer.vocabulary
    assert reloaded.encode(DATES) == tokenizer.encode(DATES)


def test_character_model_generates_the_same_after_a_preset_round_trip(tmp_path):
    from attention_zoo_keras.models.transformer import TransformerSeq2SeqLM

    tokenizer = TransformerTokenizer.from_characters(DATES + ISO_DATES)
    backbone = TransformerBackbone(
        vocabulary_size=tokenizer.vocabulary_size, num_encoder_layers=1, num_decoder_layers=1,
        num_heads=2, hidden_dim=16, intermediate_dim=32, max_sequence_length=40, dropout=0.0,
    )
    preprocessor = TransformerSeq2SeqLMPreprocessor(tokenizer, encoder_sequence_length=40, decoder_sequence_length=12)
    model = TransformerSeq2SeqLM(backbone=backbone, preprocessor=preprocessor)
    model.save_to_preset(tmp_path)

    reloaded = TransformerSeq2SeqLM.from_preset(str(tmp_path))

    assert reloaded.preprocessor.tokenizer.vocabulary == tokenizer.vocabulary
    pairs = (DATES[:2], ISO_DATES)
    for key, value in preprocessor(pairs)[0].items():
        np.testing.assert_array_equal(reloaded.preprocessor(pairs)[0][key], value)
    for num_beams in (1, 2):
        expected = model.generate(DATES, num_beams=num_beams)
        # max_length defaults to decoder_sequence_length + 1: the start token, then 11 characters and </s>.
        assert all(len(text) <= 11 for text in expected)
        assert reloaded.generate(DATES, num_beams=num_beams) == expected


def test_from_file_names_the_ways_to_read_a_transformer_tokenizer(tokenizer, tmp_path):
    tokenizer.save(tmp_path)
    message = (r"cannot be read from the one file '.*tokenizer\.json': it has three .*"
               r"TransformerTokenizer\.from_source\(PresetSource\(directory\)\).*TransformerTokenizer\.from_marian")
    with pytest.raises(TypeError, match=message):
        TransformerTokenizer.from_file(tmp_path / "tokenizer.json")
