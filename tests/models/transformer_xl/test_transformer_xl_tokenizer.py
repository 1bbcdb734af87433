"""The Transformer-XL WikiText-103 tokenizer: reading the Hub's vocabulary
pickle, WikiText-style pre-tokenization, decoding, and tokenizer.json."""

import collections
import pickle
import re

import pytest

from attention_zoo_keras.hub.source import PresetFileError
from attention_zoo_keras.hub.source import PresetSource
from attention_zoo_keras.models.transformer_xl.transformer_xl_tokenizer import TransformerXLTokenizer
from attention_zoo_keras.tokenizers.restricted_pickle import DisallowedPickleError

SYMBOLS = [
    "<eos>", "<unk>", "the", ",", ".", "The", "of", "and", "in", "to", "a", "\"", "@-@", "@,@", "@.@",
    "'s", "history", "New", "York", "1", "000", "words", "state", "art", "3", "5", "km", "Mr.", "Smith",
    "dog", "don", "'t", "U.S.", "(", ")", "approx.", "five", "It", "was", "cat", "sat", "'", "dogs", "bowls",
    "St.", "Paul", "said", "Hello", "...", "?", "!", "-", "1990", "<formula>",
]


def _vocabulary_attributes(symbols=SYMBOLS, lower_case=False):
    """The plain attributes of a `transformers` 4.37 `TransfoXLTokenizer`
    (and of the original Transformer-XL `Vocab`), as its vocabulary pickle
    holds them."""
    return {
        "counter": collections.Counter({symbol: len(symbols) - i for i, symbol in enumerate(symbols)}),
        "special": ["<eos>"],
        "min_freq": 0,
        "max_size": None,
        "lower_case": lower_case,
        "delimiter": None,
        "vocab_file": None,
        "never_split": ["<unk>", "<eos>", "<formula>"],
        "punctuation_symbols": '!"#$%&()*+,-./\\:;<=>?@[\\]^_`{|}~',
        "language": "en",
        "idx2sym": list(symbols),
        "sym2idx": collections.OrderedDict((symbol, i) for i, symbol in enumerate(symbols)),
        **({"eos_idx": symbols.index("<eos>")} if "<eos>" in symbols else {}),
    }


@pytest.fixture
def vocab_pkl(tmp_path):
    path = tmp_path / "vocab.pkl"
    path.write_bytes(pickle.dumps(_vocabulary_attributes(), protocol=2))
    return path


@pytest.fixture
def tokenizer(vocab_pkl):
    return TransformerXLTokenizer.from_vocabulary_file(vocab_pkl)


def _tokens(tokenizer, text):
    return [tokenizer.id_to_token(i) for i in tokenizer.encode([text])[0]]


def test_vocabulary_pickle_gives_ids_in_file_order(tokenizer):
    assert tokenizer.vocabulary_size == len(SYMBOLS)
    assert [tokenizer.id_to_token(i) for i in range(len(SYMBOLS))] == SYMBOLS
    assert tokenizer.end_token_id == 0 and tokenizer.unknown_token_id == 1
    assert tokenizer.special_token_ids == (0, 1)
    assert tokenizer.lower_case is False


def test_legacy_torch_save_vocabulary_gives_the_same_tokenizer(tmp_path, tokenizer):
    torch = pytest.importorskip("torch")
    path = tmp_path / "vocab.bin"
    torch.save(_vocabulary_attributes(), path, _use_new_zipfile_serialization=False)
    from_bin = TransformerXLTokenizer.from_vocabulary_file(path)
    text = ["The history of New York, in 1,000 words.", "Mr. Smith's dog don't"]
    assert from_bin.encode(text) == tokenizer.encode(text)


def test_prose_becomes_wikitext_tokens(tokenizer):
    ids = tokenizer.encode(["The history of New York, in 1,000 words."])[0]
    assert [tokenizer.id_to_token(i) for i in ids] == (
        "The history of New York , in 1 @,@ 000 words .".split()
    )
    assert ids == [SYMBOLS.index(token) for token in "The history of New York , in 1 @,@ 000 words .".split()]


@pytest.mark.parametrize(
    "text, expected",
    [
        ("state-of-the-art", "state @-@ of @-@ the @-@ art"),
        ("3.5 km", "3 @.@ 5 km"),
        ("1,000,000", "1 @,@ 000 @,@ 000"),
        ("Mr. Smith's dog.", "Mr. Smith 's dog ."),
        ("The U.S. dog, approx. five.", "The U.S. dog , approx. five ."),
        # A quote before periods goes after them, as Moses' normalizer has it.
        ("St. Paul said \"Hello\"...", 'St. Paul said " Hello ... "'),
        ("don't", "don 't"),
        ("the dogs' bowls (1990)?!", "the dogs ' bowls ( 1990 ) ? !"),
        ("a - dog", "a - dog"),
        # Unicode quotes and dashes, as the Moses punctuation normalizer writes them.
        ("“Hello,” said Smith’s dog – 1990–5", "\" Hello , \" said Smith 's dog - 1990 @-@ 5"),
    ],
)
def test_wikitext_conventions(tokenizer, text, expected):
    assert [tokenizer.backend.id_to_token(i) for i in tokenizer.encode([text])[0]] == [
        token if token in SYMBOLS else "<unk>" for token in expected.split()
    ]
    pieces = tokenizer.backend.pre_tokenizer.pre_tokenize_str(tokenizer.backend.normalizer.normalize_str(text))
    assert [piece for piece, _ in pieces] == expected.split()


def test_already_tokenized_wikitext_is_unchanged(tokenizer):
    wikitext = (
        " = Valkyria Chronicles III = \n Senjō no Valkyria 3 : Chronicles ( Japanese : 戦場のヴァルキュリア3 , "
        "lit . Valkyria of the Battlefield 3 ) , is a tactical role @-@ playing video game developed by Sega "
        "and Media.Vision for the PlayStation Portable . It sold 1 @,@ 000 copies at 3 @.@ 5 dollars ; the "
        "game 's \" Nameless \" unit , it 's said , did n't lose . "
    )
    pieces = tokenizer.backend.pre_tokenizer.pre_tokenize_str(tokenizer.backend.normalizer.normalize_str(wikitext))
    assert [piece for piece, _ in pieces] == wikitext.split()
    with_special = wikitext + " <unk> of <eos> "
    ids = tokenizer.encode([with_special])[0]
    assert [tokenizer.id_to_token(i) for i in ids] == [
        token if token in SYMBOLS else "<unk>" for token in with_special.split()
    ]


def test_unknown_words_map_to_unk(tokenizer):
    assert tokenizer.encode(["The zebra of Gondor"]) == [[5, 1, 6, 1]]


def test_special_tokens_in_text_are_read_as_themselves(tokenizer):
    assert _tokens(tokenizer, "the cat <eos> the dog<unk>.") == ["the", "cat", "<eos>", "the", "dog", "<unk>", "."]
    assert _tokens(tokenizer, "<formula> and <Formula>") == ["<formula>", "and", "<unk>", "<unk>", "<unk>"]


def test_decode_undoes_the_wikitext_conventions(tokenizer):
    text = "The history of New York, in 1,000 words."
    assert tokenizer.decode(tokenizer.encode([text])[0]) == text
    tokens = 'Mr. Smith \'s " Hello " ( 1990 ) state @-@ of @-@ the @-@ art , 3 @.@ 5 km . don \'t ...'
    ids = [SYMBOLS.index(token) for token in tokens.split()]
    assert tokenizer.decode(ids) == 'Mr. Smith\'s "Hello" (1990) state-of-the-art, 3.5 km. don\'t...'
    # As the Moses detokenizer: a quote after a word ending in "s" is a
    # possessive unless it closes a quote; other quotes pair up.
    quoted = [SYMBOLS.index(token) for token in "the dogs ' bowls and ' Hello ' said".split()]
    assert tokenizer.decode(quoted) == "the dogs' bowls and 'Hello' said"


def test_decode_skips_special_tokens_unless_asked(tokenizer):
    ids = tokenizer.encode(["the cat <unk> sat . <eos>"])[0]
    assert tokenizer.decode(ids) == "the cat sat."
    assert tokenizer.decode(ids, skip_special_tokens=False) == "the cat <unk> sat. <eos>"


def test_lower_case_vocabulary(tmp_path):
    path = tmp_path / "vocab.pkl"
    symbols = ["<eos>", "<unk>", "the", "cat", "sat", "."]
    path.write_bytes(pickle.dumps(_vocabulary_attributes(symbols, lower_case=True)))
    tokenizer = TransformerXLTokenizer.from_vocabulary_file(path)
    assert tokenizer.lower_case is True
    assert _tokens(tokenizer, "The CAT Sat. <eos>") == ["the", "cat", "sat", ".", "<eos>"]
    cased = TransformerXLTokenizer.from_vocabulary(symbols)
    assert cased.lower_case is False
    assert _tokens(cased, "The CAT sat") == ["<unk>", "<unk>", "sat"]


@pytest.mark.parametrize("lower_case", [False, True])
def test_tokenizer_json_round_trip_gives_identical_ids(tmp_path, tokenizer, lower_case):
    if lower_case:
        tokenizer = TransformerXLTokenizer.from_vocabulary(SYMBOLS, lower_case=True)
    tokenizer.save(tmp_path)
    assert (tmp_path / "tokenizer.json").is_file()
    reloaded = TransformerXLTokenizer.from_source(PresetSource(tmp_path))
    texts = [
        "The history of New York, in 1,000 words.",
        "Mr. Smith's dog don't like the U.S. state-of-the-art km (3.5) <eos> \"Hello\"",
        "the game 's \" Nameless \" unit , it 's said .",
    ]
    assert reloaded.encode(texts) == tokenizer.encode(texts)
    assert reloaded.lower_case is lower_case
    assert (reloaded.end_token_id, reloaded.unknown_token_id) == (tokenizer.end_token_id, tokenizer.unknown_token_id)
    ids = tokenizer.encode(texts)[1]
    assert reloaded.decode(ids) == tokenizer.decode(ids)


def test_sym2idx_alone_is_ordered_by_id(tmp_path):
    attributes = _vocabulary_attributes()
    del attributes["idx2sym"]
    attributes["sym2idx"] = dict(reversed(list(attributes["sym2idx"].items())))
    path = tmp_path / "vocab.pkl"
    path.write_bytes(pickle.dumps(attributes))
    tokenizer = TransformerXLTokenizer.from_vocabulary_file(path)
    assert [tokenizer.id_to_token(i) for i in range(len(SYMBOLS))] == SYMBOLS


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda a: a.update(idx2sym=None, sym2idx=None), "neither 'idx2sym' nor 'sym2idx'"),
        (lambda a: a["sym2idx"].update({"the": 7}), "disagree"),
        (lambda a: a.update(idx2sym=None, sym2idx={"<eos>": 0, "<unk>": 2}), "not 0, 1, 2"),
        (lambda a: a.update(idx2sym="<eos> <unk>"), "not a list"),
        (lambda a: a.update(delimiter=""), "character-level"),
    ],
    ids=["no-symbols", "inconsistent", "gaps", "not-a-list", "character-level"],
)
def test_malformed_vocabulary_files_name_the_file(tmp_path, change, message):
    attributes = _vocabulary_attributes()
    change(attributes)
    path = tmp_path / "vocab.pkl"
    path.write_bytes(pickle.dumps(attributes))
    with pytest.raises(PresetFileError, match=message) as raised:
        TransformerXLTokenizer.from_vocabulary_file(path)
    assert str(path) in str(raised.value)


def test_a_pickle_of_something_else_is_not_a_vocabulary(tmp_path):
    path = tmp_path / "vocab.pkl"
    path.write_bytes(pickle.dumps(["<eos>", "<unk>"]))
    with pytest.raises(PresetFileError, match="not a Transformer-XL vocabulary"):
        TransformerXLTokenizer.from_vocabulary_file(path)


def test_a_vocabulary_pickle_with_objects_is_refused(tmp_path):
    # transformers >= 4.x pickles the whole tokenizer `__dict__`, compiled
    # regexes (and sacremoses objects) included: not plain data.
    attributes = _vocabulary_attributes()
    attributes["punction_without_space_before_pattern"] = re.compile(r"[^\s][!]")
    path = tmp_path / "vocab.pkl"
    path.write_bytes(pickle.dumps(attributes))
    with pytest.raises(DisallowedPickleError, match=r"re\._compile"):
        TransformerXLTokenizer.from_vocabulary_file(path)


@pytest.mark.parametrize("missing", ["<unk>", "<eos>"])
def test_vocabulary_without_unk_or_eos_is_refused(tmp_path, missing):
    symbols = [symbol for symbol in SYMBOLS if symbol != missing]
    with pytest.raises(ValueError, match=missing):
        TransformerXLTokenizer.from_vocabulary(symbols)
    path = tmp_path / "vocab.pkl"
    attributes = _vocabulary_attributes(symbols)
    path.write_bytes(pickle.dumps(attributes))
    with pytest.raises(ValueError, match=missing):
        TransformerXLTokenizer.from_vocabulary_file(path)


def test_duplicate_or_non_string_tokens_are_refused():
    with pytest.raises(ValueError, match="twice"):
        TransformerXLTokenizer.from_vocabulary(["<eos>", "<unk>", "the", "the"])
    with pytest.raises(TypeError, match="not a string"):
        TransformerXLTokenizer.from_vocabulary(["<eos>", "<unk>", 3])
    with pytest.raises(TypeError, match="list of tokens"):
        TransformerXLTokenizer.from_vocabulary("<eos> <unk>")


# Sentences and the tokens the Moses pipeline of `transformers` 4.37 gives
# them (sacremoses' English punctuation normalizer and tokenizer with
# aggressive dash splits and no escaping, then `tokenize_numbers`), recorded
# with sacremoses 0.1.
MOSES_TOKENS = [
    ("The history of New York, in 1,000 words.", "The history of New York , in 1 @,@ 000 words ."),
    (
        "It was the U.S. Army's 3rd division (approx. 5,000 men) that won.",
        "It was the U.S. Army 's 3rd division ( approx . 5 @,@ 000 men ) that won .",
    ),
    ("\"Hello,\" she said -- it's 5.5 km away; isn't it?", "\" Hello , \" she said -- it 's 5 @.@ 5 km away ; isn 't it ?"),
    (
        "Dr. Smith and Mr. Jones met at St. Paul's on Jan. 5, 1990.",
        "Dr. Smith and Mr. Jones met at St. Paul 's on Jan. 5 , 1990 .",
    ),
    ("Prices rose 3.5% to $1,200.50 in the '90s... or so.", "Prices rose 3 @.@ 5 % to $ 1 @,@ 200 @.@ 50 in the ' 90s ... or so ."),
    ("He said: 'I don't know.' Then he left.", "He said : ' I don 't know . ' Then he left ."),
    ("state-of-the-art, well-known, e.g. this; i.e. that.", "state @-@ of @-@ the @-@ art , well @-@ known , e.g. this ; i.e. that ."),
    ("See No. 5 and No. x, pp. 12-14, Art. 3.", "See No. 5 and No. x , pp. 12 @-@ 14 , Art. 3 ."),
    ("The dogs' bowls weren't full!", "The dogs ' bowls weren 't full !"),
    ("Rock'n'roll, the 1990's and '0' or '.' as quoted.", "Rock 'n'roll , the 1990 's and ' 0' or ' .' as quoted ."),
    ("«Bonjour» — „quoted“ ‘single’ text… end.'", "\" Bonjour \" - \" quoted \" ' single ' text ... end . '"),
    ("She wrote to a@b.com about #hashtags & <tags> | pipes.", "She wrote to a @ b.com about # hashtags & < tags > | pipes ."),
]


def _pre_tokenize(tokenizer, text):
    pieces = tokenizer.backend.pre_tokenizer.pre_tokenize_str(tokenizer.backend.normalizer.normalize_str(text))
    return [piece for piece, _ in pieces]


@pytest.mark.parametrize("text, expected", MOSES_TOKENS)
def test_pre_tokenization_matches_the_moses_pipeline(text, expected):
    tokenizer = TransformerXLTokenizer.from_vocabulary(["<eos>", "<unk>"])
    assert _pre_tokenize(tokenizer, text) == expected.split()


@pytest.mark.parametrize("lower_case", [False, True])
def test_pre_tokenization_matches_sacremoses(lower_case):
    sacremoses = pytest.importorskip("sacremoses")
    normalizer = sacremoses.MosesPunctNormalizer("en")
    moses = sacremoses.MosesTokenizer("en")
    tokenizer = TransformerXLTokenizer.from_vocabulary(["<eos>", "<unk>"], lower_case=lower_case)
    for sentence, _ in MOSES_TOKENS:
        text = sentence.strip().lower() if lower_case else sentence.strip()
        tokens = moses.tokenize(
            normalizer.normalize(text),
            aggressive_dash_splits=True,
            return_str=False,
            escape=False,
            protected_patterns=["<unk>", "<eos>", "<formula>"],
        )
        expected = [part for token in tokens for part in re.sub(r"(?<=\d)[,.](?=\d)", r" @\g<0>@ ", token).split()]
        assert _pre_tokenize(tokenizer, sentence) == expected, sentence


def test_long_texts(tokenizer):
    # No timing: a text of 100,000 characters must simply come back. (The
    # unbounded look-behinds of Oniguruma made this take minutes before the
    # rules were rewritten to match forward.)
    chunk = "Mr. Smith's \"dog\" (approx. 3.5 km) isn't here..."
    chunk_ids = tokenizer.encode([chunk])[0]
    ids = tokenizer.encode([" ".join([chunk] * 2000)])[0]
    assert ids == chunk_ids * 2000
    assert tokenizer.decode(ids) == " ".join([tokenizer.decode(chunk_ids)] * 2000)
