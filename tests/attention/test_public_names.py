"""The names users reach for are public, on `attention_zoo_keras.attention`
itself, and the attention files stand alone: no module of the zoo imports
another's private names."""

import ast
from pathlib import Path

import pytest

import attention_zoo_keras
from attention_zoo_keras import attention
from attention_zoo_keras.attention import decoding
from attention_zoo_keras.attention import local
from attention_zoo_keras.attention import local_2d
from attention_zoo_keras.attention import lsh
from attention_zoo_keras.attention import lsh_decoding
from attention_zoo_keras.attention import masks
from attention_zoo_keras.attention import registry
from attention_zoo_keras.attention import sparse

ATTENTION_DIRECTORY = Path(attention_zoo_keras.__file__).parent / "attention"


@pytest.mark.parametrize(
    ("name", "defined"),
    [
        ("get_decoding", registry.get_decoding),
        ("register_decoding", registry.register_decoding),
        ("local_mask", local.local_mask),
        ("local_mask_2d", local_2d.local_mask_2d),
        ("sparse_mask", sparse.sparse_mask),
        ("causal_mask", masks.causal_mask),
        ("lsh_rotations_shape", lsh.lsh_rotations_shape),
        ("DecodingCache", decoding.DecodingCache),
        ("KeyValueCache", decoding.KeyValueCache),
        ("LSHDecodingCache", lsh_decoding.LSHDecodingCache),
    ],
)
def test_public_names_on_the_attention_package(name, defined):
    assert getattr(attention, name) is defined


def test_the_decodings_are_registered_where_users_find_them():
    assert isinstance(attention.get_decoding("softmax"), attention.KeyValueCache)
    assert isinstance(attention.get_decoding("local"), attention.KeyValueCache)
    assert isinstance(attention.get_decoding("lsh"), attention.LSHDecodingCache)


def _private_imports(path):
    """`(module, name)` of every private name `path` imports from the package."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [
        (node.module, alias.name)
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("attention_zoo_keras")
        for alias in node.names
        if alias.name.startswith("_")
    ]


@pytest.mark.parametrize("path", sorted(ATTENTION_DIRECTORY.glob("*.py")), ids=lambda path: path.name)
def test_no_attention_file_imports_private_names(path):
    assert _private_imports(path) == []
