"""Bad inputs to the attention zoo (mechanisms, their options and weights,
the registry, LSH rotations set on a Reformer) and the errors they get: a
table of cases, each run by `test_bad_attention_input`. Every message names
the argument and, where there are two, both shapes or sizes; unknown names
come with close-name suggestions."""

import functools

import numpy as np
import pytest

from attention_zoo_keras import attention
from attention_zoo_keras.attention import registry
from attention_zoo_keras.models.reformer import ReformerBackbone

HEADS, HEAD_DIM = 2, 4


def _tensor(length=8, head_dim=HEAD_DIM, seed=0):
    return np.random.default_rng(seed).standard_normal((1, length, HEADS, head_dim)).astype("float32")


X = _tensor()


@functools.cache
def _reformer(attention_layers=("local", "lsh")):
    return ReformerBackbone(
        vocabulary_size=32, hidden_dim=8, num_heads=HEADS, head_dim=HEAD_DIM, intermediate_dim=16,
        attention=list(attention_layers),
        attention_options={"lsh": {"num_buckets": 4, "chunk_length": 4}, "local": {"block_size": 4}},
        axial_pos_shape=(4, 4), axial_pos_embds_dim=(4, 4), dropout=0.0, attention_dropout={"local": 0.0},
    )


def _relative_with_narrow_value_table():
    value = _tensor(head_dim=7)
    return attention.relative_attention(
        X, X, value, relative_key_embeddings=np.zeros((7, HEAD_DIM), "float32"),
        relative_value_embeddings=np.zeros((7, 5), "float32"),
    )


# (id, callable, exception type, regex the message must match)
CASES = [
    ("unknown_mechanism", lambda: attention.get_mechanism("sofmax"), ValueError,
     r"Unknown attention mechanism 'sofmax'\. Did you mean: softmax"),
    ("misspelled_option", lambda: registry.check_options("local", {"blok_size": 4}), ValueError,
     r"'local' has no option 'blok_size'\. Did you mean: block_size"),
    ("no_decoding", lambda: attention.get_decoding("local_2d"), ValueError,
     r"'local_2d' has no incremental decoding.*softmax"),
    ("decoding_not_a_cache", lambda: attention.register_decoding("local_2d", object()), TypeError,
     r"decoding must be a DecodingCache; got object"),
    ("local_block_size_zero", lambda: attention.local_attention(X, X, X, block_size=0), ValueError,
     r"block_size must be a positive integer; got 0"),
    ("local_query_key_lengths", lambda: attention.local_attention(_tensor(6), X, X, block_size=2), ValueError,
     r"query and key lengths must be equal; got 6 and 8"),
    ("local_key_value_lengths", lambda: attention.local_attention(X, X, _tensor(6), block_size=2), ValueError,
     r"key and value must have the same length; got 8 and 6"),
    ("local_mask_query_axis", lambda: attention.local_attention(
        X, X, X, block_size=2, attention_mask=np.ones((1, 1, 5, 8), bool)), ValueError,
     r"attention_mask's query axis has size 5; expected 1 or the query length 8 \(mask shape \(1, 1, 5, 8\)\)"),
    ("local_2d_without_image_shape", lambda: attention.local_attention_2d(X, X, X), ValueError,
     r"needs image_shape=\(height, width\)"),
    ("local_2d_wrong_image_shape", lambda: attention.local_attention_2d(X, X, X, image_shape=(3, 3)), ValueError,
     r"sequence length 8 is not the number of pixels of image_shape \(3, 3\) \(9\)"),
    ("sparse_unknown_pattern", lambda: attention.sparse_attention(X, X, X, pattern="strided2"), ValueError,
     r"Unknown sparse attention pattern 'strided2'\. Did you mean: strided"),
    ("lsh_length_not_chunked", lambda: attention.lsh_attention(X, X, X, chunk_length=3, num_buckets=2), ValueError,
     r"sequence length 8 is not a multiple of chunk_length 3"),
    ("lsh_odd_buckets", lambda: attention.lsh_attention(X, X, X, chunk_length=4, num_buckets=3), ValueError,
     r"num_buckets must be an even integer ≥ 2.*got 3"),
    ("lsh_rotations_shape", lambda: attention.lsh_attention(
        X, X, X, chunk_length=4, num_buckets=4, rotations=np.zeros((2, 4, 1, 3), "float32")), ValueError,
     r"rotations must have shape .* = \(2, 4, 1, 2\).*got \(2, 4, 1, 3\)"),
    ("relative_value_table_width", _relative_with_narrow_value_table, ValueError,
     r"relative_value_embeddings has head_dim 5, the value has 7"),
    ("reformer_rotations_shape", lambda: _reformer().set_lsh_rotations(np.zeros((2, 4, 1, 3), "float32")),
     ValueError, r"LSH rotations for '.*' must have shape .* = \(2, 4, 1, 2\); got \(2, 4, 1, 3\)"),
    ("reformer_rotations_rank", lambda: _reformer().set_lsh_rotations(np.zeros((2, 4), "float32")),
     ValueError, r"must have shape .*; got \(2, 4\)"),
    ("reformer_without_lsh", lambda: _reformer(("local",)).set_lsh_rotations(np.zeros((2, 4, 1, 2), "float32")),
     ValueError, r"set_lsh_rotations: this Reformer has no LSH attention layer"),
    ("local_branch_rotations", lambda: _reformer().attention_branches[0].set_rotations(None), ValueError,
     r"set_rotations is for LSH attention branches; '.*' uses 'local' attention"),
]


def test_the_table_is_well_formed():
    ids = [case[0] for case in CASES]
    assert len(ids) == len(set(ids)) and len(ids) >= 6


@pytest.mark.parametrize(("run", "error", "message"), [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_bad_attention_input(run, error, message):
    with pytest.raises(error, match=message):
        run()
