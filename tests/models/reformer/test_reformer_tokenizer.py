"""The Reformer tokenizers: `ReformerTokenizer` against `sentencepiece` and
`transformers.ReformerTokenizer` on a tiny SentencePiece BPE model of the
kind `google/reformer-crime-and-punishment` ships, and
`ReformerByteTokenizer` against the byte scheme of the
`google/reformer-enwik8` model card; saving and loading both."""

import random
import re

import numpy as np
import pytest

from attention_zoo_keras.hub import PresetFileError
from attention_zoo_keras.hub import PresetSource
from attention_zoo_keras.models.reformer.reformer_tokenizer import ReformerByteTokenizer
from attention_zoo_keras.models.reformer.reformer_tokenizer import ReformerTokenizer
from attention_zoo_keras.models.reformer.reformer_tokenizer import byte_tokenizer
from attention_zoo_keras.tokenizers.sentencepiece_model import BPE
from attention_zoo_keras.tokenizers.sentencepiece_model import bpe_tokenizer
from attention_zoo_keras.tokenizers.sentencepiece_model import read_sentencepiece_model
from tests.support.reformer_sentencepiece import CORPUS
from tests.support.reformer_sentencepiece import train_sentencepiece

sentencepiece = pytest.importorskip("sentencepiece")
transformers = pytest.importorskip("transformers")

HAND_WRITTEN_TEXTS = [
    "",
    "   ",
    "  extra   spaces\tand\nnewlines  ",
    "trailing space ",
    " leading space",
    "numbers 0 7 12345 3.14159 1,000,000 2020-01-13",
    "punctuation: ... !!! ??? ;; -- ' \" , . : ( ) [ ] { } ~ ` @ # $ % ^ & * _ + = | \\ / < >",
    "unknown characters: дом 😀😀 ☃ ж 東京",
    "unknown at the end жж",
    "ЖЖЖ at the start",
    "Café naïve résumé",
    "fullwidth ＦＵＬＬ ①② ligature ﬁ, a\u00a0b, combining e\u0301",
    "special </s> tokens <unk> in <s> text",
    "aaaaaaaaaa eeeeeeeee tttttttt he he he hehehe",
    "ALL CAPITALS AND lower case",
    "Thewordsruntogetherwithoutanyspaces",
]


def _random_texts(count, seed=0):
    """Strings of corpus characters, spaces and characters the model lacks."""
    characters = sorted(set("".join(CORPUS))) + list("жд😀é…  \t\n")
    rng = random.Random(seed)
    return ["".join(rng.choice(characters) for _ in range(rng.randint(1, 40))) for _ in range(count)]


TEXTS = [*CORPUS, *HAND_WRITTEN_TEXTS, *_random_texts(500)]


@pytest.fixture(scope="module")
def spiece_model(tmp_path_factory):
    return train_sentencepiece(tmp_path_factory.mktemp("reformer_bpe"), "bpe")


@pytest.fixture(scope="module")
def processor(spiece_model):
    return sentencepiece.SentencePieceProcessor(model_file=str(spiece_model))


@pytest.fixture(scope="module")
def tokenizer(spiece_model):
    return ReformerTokenizer.from_sentencepiece(spiece_model)


@pytest.fixture(scope="module")
def hf_tokenizer(spiece_model):
    return transformers.ReformerTokenizer.from_pretrained(str(spiece_model.parent))


# --- the SentencePiece tokenizer ---------------------------------------------


def test_model_is_bpe_laid_out_as_the_checkpoint(spiece_model, processor):
    # The checkpoint's ids tell a BPE model: '▁' (the most frequent
    # character) is the first of the single characters, which come last.
    model = read_sentencepiece_model(spiece_model)
    assert model.model_type == BPE
    pieces = [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
    first_character = next(i for i in range(3, len(pieces)) if len(pieces[i]) == 1)
    assert pieces[first_character] == "▁"
    assert all(len(piece) == 1 for piece in pieces[first_character:])
    assert all(len(piece) > 1 for piece in pieces[3:first_character])
    assert len(pieces) > 150


def test_ids_match_sentencepiece(tokenizer, processor):
    assert tokenizer.encode(TEXTS) == [processor.encode(text) for text in TEXTS]


def test_unknown_characters_are_one_unknown_piece_per_run(tokenizer, processor):
    ids = tokenizer.encode(["unknown at the end жж", "ЖЖЖ at the start"])
    assert ids == [processor.encode("unknown at the end жж"), processor.encode("ЖЖЖ at the start")]
    assert ids[0][-2:] == [processor.piece_to_id("▁"), tokenizer.unknown_token_id]
    assert ids[1].count(tokenizer.unknown_token_id) == 1


def test_vocabulary_and_special_ids_match_sentencepiece(tokenizer, processor):
    assert tokenizer.vocabulary_size == processor.get_piece_size()
    assert [tokenizer.id_to_token(i) for i in range(tokenizer.vocabulary_size)] == [
        processor.id_to_piece(i) for i in range(processor.get_piece_size())
    ]
    assert tokenizer.end_token_id == processor.eos_id() == 2
    assert tokenizer.unknown_token_id == processor.unk_id() == 0
    assert tokenizer.special_token_ids == (2, 0)
    assert tokenizer.token_to_id("▁the") == processor.piece_to_id("▁the")


def _departs_from_sentencepiece_in_transformers(text):
    """`transformers.ReformerTokenizer` 5.x keeps a last `▁` for a text ending
    in a space, and reads special tokens written in a text."""
    return text != text.rstrip() or any(token in text for token in ("<s>", "</s>", "<unk>"))


def test_ids_match_transformers(tokenizer, hf_tokenizer):
    texts = [text for text in TEXTS if not _departs_from_sentencepiece_in_transformers(text)]
    assert len(texts) > 300
    expected = [hf_tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
    assert tokenizer.encode(texts) == expected


def test_special_ids_and_vocabulary_match_transformers(tokenizer, hf_tokenizer):
    assert tokenizer.end_token_id == hf_tokenizer.eos_token_id
    assert tokenizer.unknown_token_id == hf_tokenizer.unk_token_id
    assert hf_tokenizer.pad_token_id is None  # the original has no padding token
    vocabulary = hf_tokenizer.get_vocab()
    assert {tokenizer.id_to_token(i): i for i in range(tokenizer.vocabulary_size)} == vocabulary


def test_decode_matches_sentencepiece(tokenizer, processor):
    for ids in tokenizer.encode(TEXTS):
        if tokenizer.unknown_token_id not in ids:
            assert tokenizer.decode(ids) == processor.decode(ids)


def test_decode_matches_transformers(tokenizer, hf_tokenizer):
    for ids in tokenizer.encode(TEXTS):
        assert tokenizer.decode(ids) == hf_tokenizer.decode(ids, skip_special_tokens=True)


def test_decode_round_trip(tokenizer):
    texts = [text for text in CORPUS + ("numbers 1, 22 and 333: yes!", "a  b   c ")]
    for text in texts:
        assert tokenizer.decode(tokenizer.encode([text])[0]) == " ".join(text.split())


def test_decode_leaves_out_or_writes_special_tokens(tokenizer, processor, hf_tokenizer):
    # As transformers.ReformerTokenizer does; SentencePiece writes `<unk>` as ` ⁇ `.
    ids = tokenizer.encode(["the ж room"])[0]
    assert tokenizer.unknown_token_id in ids
    with_start_and_end = [processor.bos_id(), *ids, tokenizer.end_token_id]
    assert tokenizer.decode(with_start_and_end) == "the  room"
    assert tokenizer.decode(with_start_and_end, skip_special_tokens=False) == "<s> the <unk> room</s>"
    assert tokenizer.decode(np.array(with_start_and_end)) == "the  room"
    for skip in (True, False):
        assert tokenizer.decode(with_start_and_end, skip) == hf_tokenizer.decode(
            with_start_and_end, skip_special_tokens=skip
        )


def test_special_tokens_in_text_are_characters(tokenizer, processor):
    ids = tokenizer.encode(["the </s> and <s>"])[0]
    assert ids == processor.encode("the </s> and <s>")
    assert tokenizer.end_token_id not in ids


def test_save_and_read_back(tokenizer, tmp_path):
    tokenizer.save(tmp_path)
    assert [path.name for path in tmp_path.iterdir()] == ["tokenizer.json"]
    for reloaded in (ReformerTokenizer.from_file(tmp_path / "tokenizer.json"),
                     ReformerTokenizer.from_source(PresetSource(tmp_path))):
        assert reloaded.encode(TEXTS) == tokenizer.encode(TEXTS)
        assert reloaded.end_token_id == tokenizer.end_token_id
        ids = tokenizer.encode(["Why am I going there now?"])[0] + [tokenizer.end_token_id]
        assert reloaded.decode(ids) == tokenizer.decode(ids) == "Why am I going there now?"


def test_unigram_models_also_match_sentencepiece(tmp_path):
    path = train_sentencepiece(tmp_path, "unigram", vocab_size=150)
    processor = sentencepiece.SentencePieceProcessor(model_file=str(path))
    tokenizer = ReformerTokenizer.from_sentencepiece(path)
    # Not texts spelling a control piece with characters the model lacks
    # (`<`): the unigram pipeline reads those as the piece (see
    # `sentencepiece_model`).
    texts = [text for text in TEXTS if "<" not in text]
    assert tokenizer.encode(texts) == [processor.encode(text) for text in texts]


def test_bpe_model_without_dummy_prefix_or_whitespace_split_matches_sentencepiece(tmp_path):
    path = train_sentencepiece(tmp_path, "bpe", add_dummy_prefix=False, split_by_whitespace=False, remove_extra_whitespaces=False)
    model = read_sentencepiece_model(path)
    assert not model.add_dummy_prefix and not model.split_by_whitespace and not model.remove_extra_whitespaces
    processor = sentencepiece.SentencePieceProcessor(model_file=str(path))
    assert any("▁" in piece[1:] for piece in (processor.id_to_piece(i) for i in range(processor.get_piece_size())))
    tokenizer = bpe_tokenizer(model)
    assert [tokenizer.encode(text).ids for text in TEXTS] == [processor.encode(text) for text in TEXTS]


def test_unsupported_models_are_refused(tmp_path):
    char = train_sentencepiece(tmp_path / "char", "char")
    with pytest.raises(ValueError, match=rf"'{re.escape(str(char))}': only BPE and unigram .* this one is CHAR"):
        ReformerTokenizer.from_sentencepiece(char)
    user_defined = train_sentencepiece(tmp_path / "user", "bpe", user_defined_symbols=["<sep>"])
    with pytest.raises(ValueError, match=rf"'{re.escape(str(user_defined))}': .*user-defined pieces"):
        ReformerTokenizer.from_sentencepiece(user_defined)
    no_end = train_sentencepiece(tmp_path / "no_end", "bpe", eos_id=-1)
    with pytest.raises(ValueError, match=r"needs the token '</s>'"):
        ReformerTokenizer.from_sentencepiece(no_end)


def test_missing_or_corrupt_model_files_are_refused(spiece_model, tmp_path):
    with pytest.raises(PresetFileError, match="Cannot read the SentencePiece model"):
        ReformerTokenizer.from_sentencepiece(tmp_path / "missing.model")
    broken = tmp_path / "broken.model"
    broken.write_bytes(spiece_model.read_bytes()[:100])
    with pytest.raises(PresetFileError, match="is not a valid SentencePiece model"):
        ReformerTokenizer.from_sentencepiece(broken)


# --- the byte tokenizer -------------------------------------------------------

BYTE_TEXTS = [
    "",
    "In 1965, Brooks left IBM to found the Department of",
    "control characters \x00\x01\x7f\t\n\r",
    "Café naïve résumé Ærø Straße",
    "東京は日本の首都です。中文字符",
    "emoji 😀👍🏽 family 👨‍👩‍👧 flags 🇫🇷",
    "Ελληνικά, русский, עברית, العربية",
    "combining e\u0301 and a\u0308, zero-width\u200bspace",
    "the tokens <pad> and <EOS> and </s> are text here",
    "  spaces  at  both  ends  ",
    "[[Wikipedia|markup]] &amp; <page><title>enwik8</title></page>",
]


def _random_unicode_texts(count, seed=0):
    """Strings of code points from every plane (no surrogates)."""
    rng = random.Random(seed)
    ranges = [(0, 0x7F), (0x80, 0x7FF), (0x800, 0xD7FF), (0xE000, 0xFFFF), (0x10000, 0x10FFFF)]

    def character():
        low, high = rng.choice(ranges)
        return chr(rng.randint(low, high))

    return ["".join(character() for _ in range(rng.randint(0, 30))) for _ in range(count)]


ALL_BYTE_TEXTS = BYTE_TEXTS + _random_unicode_texts(300)


def _model_card_ids(text):
    """The enwik8 model card's encoding of one text: its UTF-8 bytes plus 2."""
    return [byte + 2 for byte in text.encode()]


def _model_card_batch(texts):
    """The model card's `encode` for ASCII texts: ids padded with 0 to the
    longest text, and the attention mask."""
    length = max(len(text) for text in texts)
    ids = np.zeros((len(texts), length), dtype="int64")
    mask = np.zeros((len(texts), length), dtype="int64")
    for row, text in enumerate(texts):
        ids[row, : len(text.encode())] = _model_card_ids(text)
        mask[row, : len(text.encode())] = 1
    return ids, mask


def _model_card_decode(ids):
    """The model card's `decode` of one sequence: `chr(id - 2)` per id above 1."""
    return "".join(chr(token_id - 2) if token_id > 1 else "" for token_id in ids)


@pytest.fixture(scope="module")
def byte_tokenizer_():
    return ReformerByteTokenizer()


def test_byte_ids_are_the_model_card_formula(byte_tokenizer_):
    assert byte_tokenizer_.encode(ALL_BYTE_TEXTS) == [_model_card_ids(text) for text in ALL_BYTE_TEXTS]


def test_byte_ids_padded_match_the_model_card_batch(byte_tokenizer_):
    texts = ["In 1965, Brooks left IBM", "to found", "the Department of"]
    expected_ids, expected_mask = _model_card_batch(texts)
    rows = byte_tokenizer_.encode(texts)
    ids = np.zeros_like(expected_ids)
    for index, row in enumerate(rows):
        ids[index, : len(row)] = row
    np.testing.assert_array_equal(ids, expected_ids)
    np.testing.assert_array_equal(ids != byte_tokenizer_.pad_token_id, expected_mask.astype(bool))


def test_every_byte_has_its_id(byte_tokenizer_):
    vocabulary = byte_tokenizer_.backend.get_vocab()
    assert sorted(vocabulary.values()) == list(range(258))
    assert byte_tokenizer_.vocabulary_size == 258
    assert byte_tokenizer_.id_to_token(0) == "<pad>" and byte_tokenizer_.id_to_token(1) == "<EOS>"
    # Every byte a UTF-8 text can hold (all but C0, C1 and F5..FF) comes out as itself + 2.
    three_bytes = [chr(0x1000 * k) for k in range(16)][1:] + ["\u0800"]  # lead bytes E0..EF
    four_bytes = [chr(plane) for plane in (0x10000, 0x40000, 0x80000, 0xC0000, 0x100000)]  # F0..F4
    text = "".join(chr(c) for c in range(0x800)) + "".join(three_bytes + four_bytes)
    ids = byte_tokenizer_.encode([text])[0]
    assert ids == _model_card_ids(text)
    assert {i - 2 for i in ids} == set(range(256)) - {0xC0, 0xC1, *range(0xF5, 0x100)}


def test_byte_decode_round_trip(byte_tokenizer_):
    for text, ids in zip(ALL_BYTE_TEXTS, byte_tokenizer_.encode(ALL_BYTE_TEXTS)):
        assert byte_tokenizer_.decode(ids) == text


def test_byte_decode_agrees_with_the_model_card_on_ascii_only(byte_tokenizer_):
    ascii_ids = _model_card_ids("In 1965, Brooks left IBM.") + [1, 0, 0]
    assert byte_tokenizer_.decode(ascii_ids) == _model_card_decode(ascii_ids) == "In 1965, Brooks left IBM."
    # The model card makes one character of each byte; the bytes are UTF-8.
    ids = _model_card_ids("né 東")
    assert _model_card_decode(ids) == "nÃ© æ\x9d±"
    assert byte_tokenizer_.decode(ids) == "né 東"


def test_byte_decode_special_tokens_and_invalid_bytes(byte_tokenizer_):
    ids = [0, *_model_card_ids("ab"), 1, 0]
    assert byte_tokenizer_.decode(ids) == "ab"
    assert byte_tokenizer_.decode(ids, skip_special_tokens=False) == "<pad>ab<EOS><pad>"
    # A lone lead byte, a lone continuation byte: each one U+FFFD.
    assert byte_tokenizer_.decode([0xC3 + 2, ord("a") + 2, 0xA9 + 2]) == "\ufffda\ufffd"
    with pytest.raises(ValueError, match="Token id 258 is outside the byte vocabulary"):
        byte_tokenizer_.decode([67, 258])


def test_byte_special_tokens(byte_tokenizer_):
    assert (byte_tokenizer_.pad_token_id, byte_tokenizer_.end_token_id) == (0, 1)
    assert byte_tokenizer_.special_token_ids == (0, 1)
    assert 0 not in byte_tokenizer_.encode(["<pad><EOS>"])[0]


def test_byte_long_text(byte_tokenizer_):
    # enwik8 batches are 65,536 characters long.
    rng = random.Random(1)
    text = "".join(rng.choice("abc é東😀 \n") for _ in range(65_536))
    ids = byte_tokenizer_.encode([text])[0]
    assert ids == _model_card_ids(text)
    assert byte_tokenizer_.decode(ids) == text


def test_byte_save_and_read_back(byte_tokenizer_, tmp_path):
    byte_tokenizer_.save(tmp_path)
    for reloaded in (ReformerByteTokenizer.from_file(tmp_path / "tokenizer.json"),
                     ReformerByteTokenizer.from_source(PresetSource(tmp_path))):
        assert reloaded.encode(ALL_BYTE_TEXTS) == byte_tokenizer_.encode(ALL_BYTE_TEXTS)
        ids = byte_tokenizer_.encode(["Straße 😀"])[0] + [1]
        assert reloaded.decode(ids) == "Straße 😀"


def test_byte_tokenizer_refuses_other_layouts(spiece_model):
    with pytest.raises(ValueError, match="does not lay out the Reformer byte ids"):
        ReformerByteTokenizer(bpe_tokenizer(read_sentencepiece_model(spiece_model)))
    with pytest.raises(TypeError, match="Expected a tokenizers.Tokenizer"):
        ReformerByteTokenizer("not a tokenizer")
    assert ReformerByteTokenizer(byte_tokenizer()).encode(["x"]) == [[ord("x") + 2]]
