"""Tokenizers: thin wrappers over the `tokenizers` library."""

from attention_zoo_keras.tokenizers.tokenizer import Tokenizer
from attention_zoo_keras.tokenizers.word_piece import word_piece_tokenizer
