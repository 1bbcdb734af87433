"""The attention zoo: one file per mechanism, pure functions on `keras.ops`."""

from attention_zoo_keras.attention.registry import get_mechanism
from attention_zoo_keras.attention.registry import mechanism_names
from attention_zoo_keras.attention.registry import register_mechanism
from attention_zoo_keras.attention.softmax import causal_mask
from attention_zoo_keras.attention.softmax import softmax_attention
