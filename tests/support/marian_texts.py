"""The texts that the Transformer (Marian) tokenizer tests encode (`TEXTS`):
the tiny Marian checkpoint's corpora, hand-written edge cases and random
strings of corpus characters and characters neither model knows."""

import random

from tests.support.tiny_checkpoints import SOURCE_CORPUS
from tests.support.tiny_checkpoints import TARGET_CORPUS

HAND_WRITTEN_TEXTS = [
    "  extra   spaces\tand\nnewlines  ",
    "",
    "   ",
    "numbers 0 7 12345 3.14159 1,000,000 2017-11-22",
    "unknown characters: дом 😀😀 ☃ ж",
    "fullwidth ＦＵＬＬ ①② ligature ﬁ, a\u00a0b, combining e\u0301",
    ">>de<< The fox sat.",
    ">>el<<The dog",
    ">>xx<< is not in the vocabulary",
    ">> a code >> without << its end",
    "not a >>de<< code",
    "special </s> tokens <unk> in <pad> text",
    "after a special token</s>>>el<< a code",
    "<s> is no special token",
    "Straße über Größe",
    "Γρήγορο καφέ",
]


def _random_texts(count, seed=0):
    """Strings of corpus characters, spaces and characters neither model knows."""
    characters = sorted(set("".join(SOURCE_CORPUS + TARGET_CORPUS))) + list("дж😀ßΓ…  \t")
    rng = random.Random(seed)
    return ["".join(rng.choice(characters) for _ in range(rng.randint(1, 30))) for _ in range(count)]


TEXTS = [*SOURCE_CORPUS, *TARGET_CORPUS, *HAND_WRITTEN_TEXTS, *_random_texts(300)]
