"""`ReformerBackbone`'s attention vocabulary: `attention` (a name per layer,
or one for every layer), `attention_options` by mechanism over the
Reformer's defaults, `attention_dropout`, the errors for unknown names,
and configs saved with the earlier flat keys."""

import json

import keras
import numpy as np
import pytest

from attention_zoo_keras.models.reformer import ReformerBackbone
from attention_zoo_keras.models.reformer import ReformerTextClassifier
from attention_zoo_keras.models.reformer.reformer_attention_options import DEFAULT_ATTENTION_OPTIONS
from attention_zoo_keras.models.reformer.reformer_attention_options import translate_legacy_config

SIZES = dict(vocabulary_size=32, hidden_dim=8, num_heads=2, head_dim=4, intermediate_dim=16,
             axial_pos_shape=(4, 4), axial_pos_embds_dim=(4, 4))
# What `ReformerBackbone.get_config()` wrote before `attention` / `attention_options`.
LEGACY_CONFIG = {
    "name": "reformer_backbone", "trainable": True, "vocabulary_size": 32, "hidden_dim": 8, "num_heads": 2,
    "head_dim": 4, "intermediate_dim": 16, "attention_layers": ["local", "lsh"], "is_causal": False, "num_hashes": 1,
    "num_buckets": 4, "lsh_chunk_length": 4, "lsh_num_chunks_before": 1, "lsh_num_chunks_after": 1, "hash_seed": 3,
    "local_chunk_length": 8, "local_num_chunks_before": 1, "local_num_chunks_after": 1, "axial_pos_shape": [4, 4],
    "axial_pos_embds_dim": [4, 4], "max_sequence_length": 16, "activation": "relu", "dropout": 0.05,
    "lsh_attention_dropout": 0.0, "local_attention_dropout": 0.0, "layer_norm_epsilon": 1e-12,
    "feed_forward_chunk_size": None, "initializer_range": 0.02, "axial_norm_std": 1.0, "pad_token_id": 0,
    "recompute": True, "seed": None,
}
LEGACY_KEYS = (
    "attention_layers", "num_hashes", "num_buckets", "lsh_chunk_length", "lsh_num_chunks_before",
    "lsh_num_chunks_after", "hash_seed", "local_chunk_length", "local_num_chunks_before", "local_num_chunks_after",
    "lsh_attention_dropout", "local_attention_dropout",
)
NEW_STYLE = dict(
    attention=["local", "lsh"], is_causal=False,
    attention_options={
        "lsh": {"num_buckets": 4, "chunk_length": 4, "num_chunks_after": 1, "seed": 3},
        "local": {"block_size": 8, "num_memory_blocks_after": 1},
    },
    attention_dropout={"local": 0.0},
)


def _output(backbone):
    ids = np.arange(2, 18, dtype="int32").reshape(1, 16) % 32
    outputs = backbone({"token_ids": ids, "padding_mask": np.ones_like(ids)})
    return keras.ops.convert_to_numpy(outputs["sequence_output"])


def test_defaults_are_the_reformers():
    backbone = ReformerBackbone(**SIZES)
    assert backbone.attention == ["local", "lsh"] * 3
    assert backbone.num_layers == 6
    assert backbone.attention_options == DEFAULT_ATTENTION_OPTIONS
    assert backbone.attention_dropout == {"lsh": 0.0, "local": 0.05}
    local, lsh = backbone.attention_branches[:2]
    assert local.attention_options == {"block_size": 64, "num_memory_blocks": 1, "num_memory_blocks_after": 0,
                                       "cyclic": False}
    assert lsh.attention_options == DEFAULT_ATTENTION_OPTIONS["lsh"]
    assert (local.attention_dropout, lsh.attention_dropout) == (0.05, 0.0)


def test_options_fill_in_over_the_defaults_and_reach_the_layers():
    backbone = ReformerBackbone(**SIZES, **NEW_STYLE)
    given = NEW_STYLE["attention_options"]
    assert backbone.attention_options["lsh"] == {**DEFAULT_ATTENTION_OPTIONS["lsh"], **given["lsh"]}
    local, lsh = backbone.attention_branches
    assert local.attention_options["cyclic"]  # a bidirectional stack's local windows wrap around
    assert local.attention_options["block_size"] == 8 and lsh.attention_options["chunk_length"] == 4
    assert backbone.chunk_lengths == [4, 8]


def test_one_name_for_every_layer_with_num_layers():
    backbone = ReformerBackbone(**SIZES, attention="lsh", num_layers=3,
                                attention_options={"lsh": {"num_buckets": 4, "chunk_length": 4}})
    assert backbone.attention == ["lsh"] * 3
    assert [branch.attention for branch in backbone.attention_branches] == ["lsh"] * 3
    with pytest.raises(ValueError, match="give num_layers too"):
        ReformerBackbone(**SIZES, attention="lsh")
    with pytest.raises(ValueError, match="names 2 layers' mechanisms.*num_layers=3"):
        ReformerBackbone(**SIZES, attention=["lsh", "local"], num_layers=3)


def test_a_single_rate_of_attention_dropout_is_every_layers():
    backbone = ReformerBackbone(**SIZES, attention=["local", "lsh", "softmax"], attention_dropout=0.1)
    assert [branch.attention_dropout for branch in backbone.attention_branches] == [0.1, 0.1, 0.1]


@pytest.mark.parametrize(
    "arguments, message",
    [
        ({"attention": ["local", "lhs"]}, "lhs"),
        ({"attention_options": {"lhs": {"seed": 0}}}, "lhs"),
        ({"attention_options": {"lsh": {"chunk_size": 4}}}, r"'lsh' has no option 'chunk_size'.*chunk_length"),
        ({"attention_options": {"local": {"local_chunk_length": 4}}}, r"'local' has no option 'local_chunk_length'"),
        ({"attention_options": {"block_size": 4}}, r"maps each mechanism to a dict of its options"),
        ({"attention_dropout": {"lhs": 0.1}}, "lhs"),
        ({"is_causal": True, "attention_options": {"lsh": {"num_chunks_after": 1}}},
         r"attention_options\['lsh'\]\['num_chunks_after'\] must be 0"),
        ({"is_causal": True, "attention_options": {"local": {"num_memory_blocks_after": 1}}},
         r"attention_options\['local'\]\['num_memory_blocks_after'\] must be 0"),
    ],
    ids=["mechanism", "options_mechanism", "lsh_option", "local_option", "flat_options", "dropout_mechanism",
         "causal_lsh", "causal_local"],
)
def test_unknown_names_and_causal_look_ahead_are_errors(arguments, message):
    with pytest.raises(ValueError, match=message):
        ReformerBackbone(**SIZES, **arguments)


def test_get_config_writes_the_new_keys_and_round_trips():
    backbone = ReformerBackbone(**SIZES, **NEW_STYLE)
    config = backbone.get_config()
    assert {"attention", "attention_options", "num_layers", "attention_dropout"} <= set(config)
    assert not set(config) & set(LEGACY_KEYS)
    rebuilt = ReformerBackbone.from_config(config)
    assert rebuilt.get_config() == config
    rebuilt.set_weights(backbone.get_weights())
    np.testing.assert_allclose(_output(rebuilt), _output(backbone), atol=1e-6)


def test_a_config_saved_with_the_old_keys_loads_as_the_same_model():
    translated = translate_legacy_config(LEGACY_CONFIG)
    assert translated["attention"] == ["local", "lsh"]
    assert translated["attention_options"] == {
        "lsh": {"num_hashes": 1, "num_buckets": 4, "chunk_length": 4, "num_chunks_before": 1, "num_chunks_after": 1,
                "seed": 3},
        "local": {"block_size": 8, "num_memory_blocks": 1, "num_memory_blocks_after": 1},
    }
    assert translated["attention_dropout"] == {"lsh": 0.0, "local": 0.0}
    assert set(translated) == set(LEGACY_CONFIG) - set(LEGACY_KEYS) | {"attention", "attention_options",
                                                                       "attention_dropout"}
    old = ReformerBackbone.from_config(LEGACY_CONFIG)
    new = ReformerBackbone(**SIZES, **NEW_STYLE, name=LEGACY_CONFIG["name"])
    assert old.get_config() == new.get_config()
    old.set_weights(new.get_weights())
    np.testing.assert_allclose(_output(old), _output(new), atol=1e-6)


def test_a_task_config_holding_an_old_backbone_config_loads():
    classifier = ReformerTextClassifier(ReformerBackbone(**SIZES, **NEW_STYLE), num_classes=2)
    config = classifier.get_config()
    config["backbone"] = {**config["backbone"], "config": LEGACY_CONFIG}
    rebuilt = ReformerTextClassifier.from_config(config)
    assert rebuilt.backbone.attention_options == classifier.backbone.attention_options


def test_a_preset_saved_with_the_old_keys_loads(tmp_path):
    """A native preset written before the rename: its config.json holds the
    old keys, which the loader upgrades before checking them."""
    backbone = ReformerBackbone(**SIZES, **NEW_STYLE, name=LEGACY_CONFIG["name"])
    backbone.save_to_preset(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    saved["config"] = LEGACY_CONFIG
    (tmp_path / "config.json").write_text(json.dumps(saved))
    loaded = ReformerBackbone.from_preset(str(tmp_path))
    assert loaded.get_config() == backbone.get_config()
    np.testing.assert_allclose(_output(loaded), _output(backbone), atol=1e-6)
