"""The word-level tokenizer of Transformer-XL's WikiText-103 model (Dai et
al., 2019; WikiText: Merity et al., 2016).

WikiText-103 is tokenized text: words and punctuation separated by spaces,
hyphens inside words written `@-@` ("state @-@ of @-@ the @-@ art"), and
digit separators written `@,@` and `@.@` ("1 @,@ 000", "3 @.@ 5"). The
model's vocabulary (267,735 words) holds these tokens, `<unk>` for the rare
words the corpus replaced, and `<eos>` for line ends.

`transformers.TransfoXLTokenizer` (4.37, now deprecated) turns prose into
such tokens with the Moses punctuation normalizer and tokenizer
(`sacremoses`, English, `aggressive_dash_splits=True`, no XML escaping) and
then splits digit separators. This module does the same with `tokenizers`
regex normalizers and pre-tokenizers, so it needs neither `sacremoses` nor
pickle and is saved as a plain `tokenizer.json`. On 20,596 paragraphs of
English docstrings it gives sacremoses' tokens except for the first
difference below. What differs from the Moses pipeline:

- Already-tokenized WikiText is left unchanged: `@-@`, `@,@` and `@.@` stay
  whole, and so do the clitics `'s`, `'t`, `'re`, `'ve`, `'ll`, `'m`, `'d`
  standing after a space before a space, and `n't` standing alone. Moses
  splits these (`@ - @`, `' s`, `n 't`), so `transformers` turns WikiText
  into tokens WikiText does not have.
- Moses' regexes skip a comma or apostrophe whose neighbour the previous
  match consumed. That is reproduced for apostrophes one level deep
  (`'0'` -> `' 0'`, "rock'n'roll" -> `rock 'n'roll`), not for longer
  chains, and not for commas: `a,,5` gives `a , , 5` (Moses `a , ,5`), and
  a comma before a digit at the very start of a text is split off (`, 5`;
  Moses keeps `,5`).
- Character classes follow Unicode properties (`Alphabetic`, `Nd`,
  `Lowercase`) rather than the Perl tables of the older Unicode version
  Moses ships, which differ for some rare characters; a comma between two
  numerals that are not decimal digits (Roman numerals) is split off.

Everything else follows Moses: other symbols are split off, a hyphen
between letters or digits becomes `@-@` (a hyphen elsewhere stays), a comma
is split off unless it sits between digits (then `@,@`), runs of periods
are one token, the English apostrophe rules ("don't" -> `don 't`,
"dogs'" -> `dogs '`, "1990's" -> `1990 's`), a word's final period is
split off unless the word is a Moses non-breaking prefix ("Mr.", "Dr.",
"St.", single capitals, ...), contains a period and a letter ("U.S."),
or the next word starts in lower case (so "approx. five" keeps
"approx."), a period between digits becomes `@.@`, and the normalizer's
rules for Unicode quotes and dashes, `` ` `` and `''`, and quotes before
periods and commas. `<unk>`, `<eos>` and `<formula>` (if the vocabulary has
it) written in a text are read as those tokens, and each stretch between
them is tokenized on its own, stripped, as `transformers` does. With
`lower_case` the text is lower-cased first.

Decoding follows the Moses detokenizer (which `transformers` uses): tokens
are joined with spaces, `@-@`, `@,@`, `@.@` become `-`, `,`, `.`, and no
space is left before closing punctuation (`. , ; : ! ? % ) ] }`), clitics
(`'s`, and `n't`, which Moses leaves alone) and the apostrophe of a
possessive ending in "s", after opening brackets and currency signs, or
inside a pair of single or double quotes (paired from the start of the
text).
"""

from pathlib import Path

import tokenizers
from tokenizers import AddedToken
from tokenizers import Regex
from tokenizers import decoders
from tokenizers import models
from tokenizers import normalizers
from tokenizers import pre_tokenizers

from attention_zoo_keras.hub.source import PresetFileError
from attention_zoo_keras.tokenizers.restricted_pickle import load_plain_pickle
from attention_zoo_keras.tokenizers.tokenizer import Tokenizer

END_TOKEN = "<eos>"
UNKNOWN_TOKEN = "<unk>"
FORMULA_TOKEN = "<formula>"

# Character classes (inside [...]): Moses' IsAlpha and IsAlnum.
_ALPHA = r"\p{Alphabetic}"
_ALNUM = r"\p{Alphabetic}\p{Nd}"

# Moses' English non-breaking prefixes (sacremoses `nonbreaking_prefix.en`):
# a word made of one of these and a final period keeps the period. "i.e" and
# "e.g" are covered by the rule for words holding a period and a letter.
_NONBREAKING_PREFIXES = [chr(c) for c in range(ord("A"), ord("Z") + 1)] + (
    "Adj Adm Adv Asst Bart Bldg Brig Bros Capt Cmdr Col Comdr Con Corp Cpl DR Dr Drs Ens Gen Gov "
    "Hon Hr Hosp Insp Lt MM MR MRS MS Maj Messrs Mlle Mme Mr Mrs Ms Msgr Op Ord Pfc Ph Prof Pvt Rep "
    "Reps Res Rev Rt Sen Sens Sfc Sgt Sr St Supt Surg v vs rev Rs Nos Nr Jan Feb Mar Apr Jun Jul Aug "
    "Sep Oct Nov Dec"
).split()
# ... and these keep it only before a number ("No. 5").
_NUMERIC_ONLY_PREFIXES = ["No", "Art", "pp"]

# The rules of the Moses punctuation normalizer (English) that change tokens,
# in its order, as literal replacements.
_PUNCTUATION_NORMALIZATION = [
    ("\r", ""),
    ("`", "'"),
    ("''", ' " '),
    ("„", '"'),
    ("“", '"'),
    ("”", '"'),
    ("–", "-"),
    ("—", " - "),
    ("´", "'"),
    ("‘", "'"),
    ("‚", "'"),
    ("’", "'"),
    ("''", '"'),
    ("…", "..."),
    ("\u00a0«\u00a0", '"'),
    ("«\u00a0", '"'),
    ("«", '"'),
    ("\u00a0»\u00a0", '"'),
    ("\u00a0»", '"'),
    ("»", '"'),
]

# A hyphen between letters or digits (Moses' aggressive dash split).
_HYPHEN = rf"(?<=[{_ALNUM}])-(?=[{_ALNUM}])"

# Moses' final-period rule, written to match forward from the start of the
# word (`\K` then replaces only the period): Oniguruma's look-behinds of
# unbounded length scan back to the start of the text, which is quadratic.
#
# A word starts at the start, after a character that is not a letter,
# digit, period or hyphen, or after a run of periods. It is letters, digits,
# hyphens and single inner periods.
_RUN = rf"[{_ALNUM}\-]"
_WORD_START = rf"(?<=\A|[^{_ALNUM}.\-]|\.\.)"
_WORD = rf"(?:{_RUN}|\.(?={_RUN}))*+"
# The word holds a letter and an inner period ("U.S", "e.g", "3.5km").
_HAS_PERIOD_AND_LETTER = rf"(?=(?:[\p{{Nd}}\-]|\.(?={_RUN}))*+[{_ALPHA}]){_RUN}*+\.(?={_RUN})"
# A word after a letter or digit and an apostrophe ("'Mr" in "No'Mr.") is
# no non-breaking prefix: Moses splits before that apostrophe.
_AFTER_CLITIC_APOSTROPHE = rf"(?<=[{_ALNUM}]')"
# A period that ends its token: at the end, or before a character that is
# not a letter, digit, period or hyphen, except an apostrophe that Moses
# leaves attached (`'.'` -> `' .'`).
_TOKEN_END = rf"(?=\z|[^{_ALNUM}.\-])(?!(?<=[^{_ALPHA}]'\.)')"
# The final period of a word is split off unless the word holds a period and
# a letter, is a non-breaking prefix, is a numeric-only prefix before a
# number, or the next word starts in lower case. The word may be empty after
# an apostrophe (`'0'.` -> `' 0' .`).
_FINAL_PERIOD = (
    _WORD_START
    + rf"(?!{_HAS_PERIOD_AND_LETTER})"
    + rf"(?:{_AFTER_CLITIC_APOSTROPHE}|(?!(?:{'|'.join(_NONBREAKING_PREFIXES)})\.{_TOKEN_END}))"
    + rf"(?:{_AFTER_CLITIC_APOSTROPHE}|(?!(?:{'|'.join(_NUMERIC_ONLY_PREFIXES)})\.\s+[0-9]))"
    + _WORD
    + rf"\K(?<=[{_ALNUM}'\-])\."
    + _TOKEN_END
    + r"(?!\s+\p{Lowercase})"
)

# English clitics, kept whole after a space (WikiText writes "it 's").
_CLITIC = r"(?i:s|t|re|ve|ll|m|d)(?=\s|\z)"

# Apostrophes split off on their own (Moses' English rules 1 to 3): between
# two non-letters; after a character neither letter nor digit and before a
# letter; after a letter and before a non-letter.
_APOSTROPHE_ALONE = (
    rf"(?<=[^{_ALPHA}])(?<![^{_ALPHA}]'[\s\p{{Nd}}.\-])'(?=[^{_ALPHA}])"
    rf"|(?<=[^{_ALPHA}\p{{Nd}}])(?!(?<=\s)'{_CLITIC})'(?=[{_ALPHA}])"
    rf"|(?<=[{_ALPHA}])'(?=[^{_ALPHA}])"
)
# Apostrophes that start a clitic (rules 4 and 5): between letters
# ("don't" -> "don 't", but WikiText's "n't" stays), and "'s" after a digit.
_APOSTROPHE_CLITIC = (
    rf"(?!(?<=(?:\A|\s)[nN])'[tT](?=\s|\z))(?<=[{_ALPHA}])(?<![{_ALPHA}]'[{_ALPHA}])'(?=[{_ALPHA}])"
    r"|(?<=\p{Nd})'(?=s)"
)
# Characters Moses pads with spaces: all but letters, digits, whitespace and
# . ' ` , -; WikiText's @-@ @,@ @.@ stay whole.
_PADDED = rf"@[-,.]@|[^{_ALNUM}\s.'`,\-]"


def _normalizer(lower_case):
    replace = normalizers.Replace
    steps = [normalizers.Lowercase()] if lower_case else []
    steps += [replace(old, new) for old, new in _PUNCTUATION_NORMALIZATION]
    steps += [
        # A quote before periods and commas goes after them: `"word".` -> `"word."`.
        replace(Regex(r'"[,.]+\K(?![,.])'), '"'),
        replace(Regex(r'"(?=[,.]+")'), ""),
        # Moses' normalizer reads a no-break space between digits as a decimal point.
        replace(Regex(r"(?<=\p{Nd})\u00a0(?=\p{Nd})"), "."),
        replace(Regex(r"[\x00-\x08\x0e-\x1b]"), ""),
        replace(Regex(r"[\s\x1c-\x1f]+"), " "),
        normalizers.Strip(),
        replace(Regex(_HYPHEN), " @-@ "),
        replace(Regex(_FINAL_PERIOD), " ."),
        replace(Regex(r"(?<!\.)\.'\z"), " . ' "),
        replace(Regex(r"(?<=\p{Nd}),(?=\p{Nd})"), " @,@ "),
        replace(Regex(r"(?<=\p{Nd})\.(?=\p{Nd})"), " @.@ "),
    ]
    return normalizers.Sequence(steps)


def _pre_tokenizer():
    split = pre_tokenizers.Split
    return pre_tokenizers.Sequence(
        [
            split(Regex(_APOSTROPHE_ALONE), behavior="isolated"),
            split(Regex(_APOSTROPHE_CLITIC), behavior="merged_with_next"),
            split(Regex(_PADDED), behavior="isolated"),
            split(Regex(r"\.{2,}"), behavior="isolated"),
            split(Regex(r"@,@|,"), behavior="isolated"),
            pre_tokenizers.WhitespaceSplit(),
        ]
    )


# Decoding. Quotes are paired up first, while every token still has one
# space before it. A single quote token stands alone: a space before it and a
# space or the end after it; other apostrophes belong to tokens ("'s", "0'").
_IN_TOKEN_APOSTROPHE = r"'(?! |\z)|(?<=[^ ])'"
_LONE_QUOTE = r"(?<= )'(?= |\z)"
# Outside a pair, a lone quote after a word ending in "s" is a possessive
# ("the dogs ' bowls"), not an opening quote.
_OUTSIDE_QUOTES = rf"(?:[^']|{_IN_TOKEN_APOSTROPHE}|(?<=s )')*+"
_INSIDE_QUOTES = rf"(?:[^' ]| (?!'(?: |\z))|{_IN_TOKEN_APOSTROPHE})*+"
# Each match starts where the last one ended (`\G`), alternately at an
# opening quote (removing the space after it) and at a closing quote
# (removing the space before it), so the text is read once.
_SINGLE_QUOTES = (
    rf"(?:\A|\G(?<=')){_OUTSIDE_QUOTES}\K{_LONE_QUOTE} ?"
    rf"|\G(?<=' ){_INSIDE_QUOTES}\K ?'(?= |\z)"
)


def _decoder():
    replace = decoders.Replace
    return decoders.Sequence(
        [
            # Every token gets a leading space; the text is then one string.
            replace(Regex(r"^"), " "),
            decoders.Fuse(),
            replace(" @-@ ", "-"),
            replace(" @,@ ", ","),
            replace(" @.@ ", "."),
            # No space before clitics ("'s") and "n't".
            replace(Regex(rf" (?='[{_ALPHA}]|n't(?: |\z))"), ""),
            # Quotes pair up from the start: no space inside a pair. Single
            # quotes first, while the spaces around them are all there; a
            # possessive's apostrophe joins the word.
            replace(Regex(_SINGLE_QUOTES), "'"),
            replace(Regex(r"(?<=s) (?='(?: |\z))"), ""),
            # Each match runs on from where the last one ended (`\G`) over
            # whole pairs, so the text is read once.
            replace(Regex(r'(?:\A|\G(?<=[\s\S])[^"]*+")(?:[^"]*+"[^"]*+")*?[^"]*+\K" '), '"'),
            replace(Regex(r'"[^"]*?\K ?"'), '"'),
            # No space before closing punctuation.
            replace(Regex(r" (?=[,.?!:;%\\}\])]+(?:[ \"']|\z))"), ""),
            # No space after opening brackets and currency signs.
            replace(Regex(r"(?<=[\p{Sc}(\[{¿¡])(?<=(?:\A|[ \"'])[\p{Sc}(\[{¿¡]{1,16}) (?=\S)"), ""),
            replace(Regex(r"\A\s+|\s+\z"), ""),
        ]
    )


class TransformerXLTokenizer(Tokenizer):
    """Word-level tokenizer of Transformer-XL's WikiText-103 model: text to
    WikiText-style words (see the module docstring), each looked up in the
    vocabulary, `<unk>` for words it lacks. `<eos>` ends a line.

    Build it from the Hub's vocabulary pickle
    (`TransformerXLTokenizer.from_vocabulary_file`, for converters), from a
    list of tokens in id order (`from_vocabulary`), or from a
    `tokenizer.json` (`from_file`, `from_source`).

    Args:
        tokenizer: `tokenizers.Tokenizer`. Its vocabulary has `<unk>` and
            `<eos>`.

    Example:

    >>> tokenizer = TransformerXLTokenizer.from_vocabulary(
    ...     ["<eos>", "<unk>", "The", "history", "of", "New", "York", ",", "in",
    ...      "1", "@,@", "000", "words", "."])
    >>> ids = tokenizer.encode(["The history of New York, in 1,000 words."])[0]
    >>> [tokenizer.id_to_token(i) for i in ids]
    ['The', 'history', 'of', 'New', 'York', ',', 'in', '1', '@,@', '000', 'words', '.']
    >>> tokenizer.decode(ids)
    'The history of New York, in 1,000 words.'
    >>> tokenizer.encode(["The history of Paris"])
    [[2, 3, 4, 1]]
    """

    def __init__(self, tokenizer):
        super().__init__(tokenizer)
        for token in (UNKNOWN_TOKEN, END_TOKEN):
            if self.backend.token_to_id(token) is None:
                raise ValueError(
                    f"A Transformer-XL vocabulary needs the token '{token}', which this one lacks."
                )
        self.unknown_token_id = self.token_to_id(UNKNOWN_TOKEN)
        self.end_token_id = self.token_to_id(END_TOKEN)

    @property
    def special_token_ids(self):
        """Ids of `<eos>` and `<unk>`."""
        return (self.end_token_id, self.unknown_token_id)

    @property
    def lower_case(self):
        """Whether texts are lower-cased before they are split."""
        normalizer = self.backend.normalizer
        if isinstance(normalizer, normalizers.Sequence):
            normalizer = normalizer[0] if len(normalizer) else None
        return isinstance(normalizer, normalizers.Lowercase)

    @classmethod
    def from_vocabulary(cls, symbols, lower_case=False):
        """From the tokens of the vocabulary in id order (a token's id is its
        index), which must include `<unk>` and `<eos>`.

        Args:
            symbols: sequence of str. Distinct strings.
            lower_case: bool. Lower-case texts before splitting them (as the
                vocabulary's `lower_case` says; `False` for WikiText-103).
        """
        if isinstance(symbols, (str, bytes, Path)):
            raise TypeError("Pass the vocabulary as a list of tokens in id order.")
        symbols = list(symbols)
        vocabulary = {}
        for index, symbol in enumerate(symbols):
            if not isinstance(symbol, str):
                raise TypeError(f"Vocabulary entry {index} is {type(symbol).__name__}, not a string.")
            if symbol in vocabulary:
                raise ValueError(f"The vocabulary lists '{symbol}' twice (ids {vocabulary[symbol]} and {index}).")
            vocabulary[symbol] = index
        for token in (UNKNOWN_TOKEN, END_TOKEN):
            if token not in vocabulary:
                raise ValueError(f"A Transformer-XL vocabulary needs the token '{token}', which this one lacks.")
        tokenizer = tokenizers.Tokenizer(models.WordLevel(vocabulary, unk_token=UNKNOWN_TOKEN))
        tokenizer.normalizer = _normalizer(lower_case)
        tokenizer.pre_tokenizer = _pre_tokenizer()
        tokenizer.decoder = _decoder()
        tokenizer.add_special_tokens(
            [
                AddedToken(token, special=True, normalized=False)
                for token in (END_TOKEN, UNKNOWN_TOKEN, FORMULA_TOKEN)
                if token in vocabulary
            ]
        )
        return cls(tokenizer)

    @classmethod
    def from_vocabulary_file(cls, path):
        """From the vocabulary file of a `transformers` Transformer-XL
        checkpoint: `vocab.pkl` (a pickle) or `vocab.bin` (legacy
        `torch.save`) holding the old tokenizer's attributes. Read with
        `load_plain_pickle`, which admits plain data only; meant for
        converters, once.

        The tokens are `idx2sym` (or `sym2idx` ordered by id); `lower_case`
        is taken from the file.

        Raises:
            PresetFileError: the file is unreadable, not a pickle of plain
                data, or not a Transformer-XL vocabulary.
            ValueError: the vocabulary lacks `<unk>` or `<eos>`.
        """
        content = load_plain_pickle(path)
        if not isinstance(content, dict):
            raise PresetFileError(
                f"'{path}' is not a Transformer-XL vocabulary: it holds a {type(content).__name__}, "
                "not a dict of tokenizer attributes."
            )
        symbols = content.get("idx2sym")
        by_symbol = content.get("sym2idx")
        if by_symbol is not None and not isinstance(by_symbol, dict):
            raise PresetFileError(f"'{path}': 'sym2idx' is a {type(by_symbol).__name__}, not a dict.")
        if symbols is not None:
            if not isinstance(symbols, (list, tuple)):
                raise PresetFileError(f"'{path}': 'idx2sym' is a {type(symbols).__name__}, not a list.")
            if by_symbol and dict(by_symbol) != {symbol: index for index, symbol in enumerate(symbols)}:
                raise PresetFileError(f"'{path}': 'idx2sym' and 'sym2idx' disagree.")
        elif by_symbol:
            ids = list(by_symbol.values())
            if any(type(i) is not int for i in ids) or sorted(ids) != list(range(len(ids))):
                raise PresetFileError(f"'{path}': the ids of 'sym2idx' are not 0, 1, 2, ...")
            symbols = sorted(by_symbol, key=by_symbol.__getitem__)
        else:
            raise PresetFileError(
                f"'{path}' is not a Transformer-XL vocabulary: it has neither 'idx2sym' nor 'sym2idx'."
            )
        if content.get("delimiter") == "":
            raise PresetFileError(
                f"'{path}' is a character-level vocabulary (empty delimiter); only word-level "
                "vocabularies are supported."
            )
        try:
            return cls.from_vocabulary(symbols, lower_case=bool(content.get("lower_case", False)))
        except TypeError as error:
            raise PresetFileError(f"'{path}': {error}") from error
