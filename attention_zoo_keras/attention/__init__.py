"""The attention zoo: one file per mechanism, pure functions on `keras.ops`.

Besides the mechanisms: `registry.py` (mechanisms and their decoding by
name), `decoding.py` (the decoding protocol and the key/value cache),
`masks.py` and `blocks.py` (helpers the mechanisms share), `probabilities.py`
(any mechanism's attention weights, read off its own computation).

>>> from attention_zoo_keras import attention
>>> "linear" in attention.mechanism_names() and attention.get("softmax") is attention.softmax_attention
True
>>> attention.get_decoding("softmax").position_addressed
True
"""

from attention_zoo_keras.attention.additive import additive_attention
from attention_zoo_keras.attention.decoding import DecodingCache
from attention_zoo_keras.attention.decoding import KeyValueCache
from attention_zoo_keras.attention.linear import causal_linear_attention
from attention_zoo_keras.attention.linear import linear_attention
from attention_zoo_keras.attention.linear_decoding import linear_attention_initial_state
from attention_zoo_keras.attention.linear_decoding import linear_attention_step
from attention_zoo_keras.attention.local import local_attention
from attention_zoo_keras.attention.local import local_mask
from attention_zoo_keras.attention.local_2d import local_attention_2d
from attention_zoo_keras.attention.local_2d import local_mask_2d
from attention_zoo_keras.attention.lsh import lsh_attention
from attention_zoo_keras.attention.lsh import lsh_rotations_shape
from attention_zoo_keras.attention.lsh_decoding import LSHDecodingCache
from attention_zoo_keras.attention.masks import causal_mask
from attention_zoo_keras.attention.probabilities import attention_probabilities
from attention_zoo_keras.attention.registry import get_decoding
from attention_zoo_keras.attention.registry import get_mechanism
from attention_zoo_keras.attention.registry import get_mechanism as get
from attention_zoo_keras.attention.registry import mechanism_names
from attention_zoo_keras.attention.registry import register_decoding
from attention_zoo_keras.attention.registry import register_mechanism
from attention_zoo_keras.attention.relative import relative_attention
from attention_zoo_keras.attention.relative import skewed_relative_logits
from attention_zoo_keras.attention.softmax import softmax_attention
from attention_zoo_keras.attention.sparse import sparse_attention
from attention_zoo_keras.attention.sparse import sparse_mask
from attention_zoo_keras.attention.xl import relative_shift
from attention_zoo_keras.attention.xl import xl_attention
from attention_zoo_keras.attention.xl import xl_attention_mask
