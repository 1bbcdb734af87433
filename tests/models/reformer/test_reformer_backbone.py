"""`ReformerBackbone`'s common behaviour through the family test harness:
config round trip, output shapes at other batch sizes and lengths (padded
to the chunk lengths inside, cut back on the way out), the compiled
`predict`, `.keras` saving, mixed precision and a preset round trip."""

import numpy as np

from attention_zoo_keras.models.reformer import ReformerBackbone
from tests.support.family_tests import run_backbone_test
from tests.support.family_tests import run_preset_test

TINY = dict(
    vocabulary_size=32, hidden_dim=8, num_heads=2, head_dim=4, intermediate_dim=16, attention=["local", "lsh"],
    is_causal=False, attention_options={"lsh": {"num_buckets": 4, "chunk_length": 4, "seed": 3},
                                        "local": {"block_size": 4}},
    axial_pos_shape=(4, 4), axial_pos_embds_dim=(4, 4), dropout=0.0, attention_dropout=0.0,
)


def _inputs(batch, length):
    token_ids = np.arange(1, batch * length + 1).reshape(batch, length) % 31 + 1
    return {"token_ids": token_ids.astype("int32"), "padding_mask": np.ones((batch, length), "int32")}


def test_backbone_behaviour(tmp_path):
    (tmp_path / "keras").mkdir()
    backbone = run_backbone_test(
        ReformerBackbone, TINY, _inputs(2, 8), {"sequence_output": (2, 8, 16)}, tmp_path / "keras",
        variable_input_data=[(_inputs(3, 6), {"sequence_output": (3, 6, 16)}),
                             (_inputs(1, 16), {"sequence_output": (1, 16, 16)})],
    )
    run_preset_test(backbone, str(tmp_path / "preset"), _inputs(2, 8))
