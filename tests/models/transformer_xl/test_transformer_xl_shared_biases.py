"""Transformer-XL with one content bias u and one position bias v shared by
every layer (`per_layer_biases=False`, the checkpoints' `untie_r: false`):
each block must use u where the authors' formula puts u and v where it puts
v (Dai et al., 2019, §3.3: `(q + u)·k` and `(q + v)·W_R R`), i.e. the model
equals a per-layer-bias model whose every layer has that u and v, and a
converted `untie_r: false` checkpoint equals the untied conversion with the
biases replicated."""

import json
from pathlib import Path

import keras
import numpy as np
from safetensors.numpy import load_file
from safetensors.numpy import save_file

from attention_zoo_keras.models.transformer_xl import TransformerXLBackbone
from attention_zoo_keras.models.transformer_xl import TransformerXLCausalLM
from attention_zoo_keras.models.transformer_xl.transformer_xl_backbone import SharedRelativeBiases

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "transfo_xl"
NUM_HEADS, HEAD_DIM = 2, 4
ATOL = 1e-5


def _backbone(per_layer_biases, num_layers=2):
    keras.utils.set_random_seed(3)
    return TransformerXLBackbone(
        vocabulary_size=20, num_layers=num_layers, num_heads=NUM_HEADS, hidden_dim=8, head_dim=HEAD_DIM,
        intermediate_dim=16, mem_len=3, per_layer_biases=per_layer_biases, dropout=0.0, initializer_range=0.5,
    )


def _inputs(backbone):
    ids = np.array([[1, 2, 3, 4], [5, 6, 7, 8]], dtype="int32")
    memory = np.random.default_rng(0).normal(size=backbone.initial_memory(2).shape).astype("float32")
    return {"token_ids": ids, "memory": memory}


def _output(backbone, inputs):
    return np.asarray(keras.ops.convert_to_numpy(backbone(inputs)["sequence_output"]))


def _biases(seed):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(NUM_HEADS, HEAD_DIM)).astype("float32") for _ in range(2))


def test_the_shared_layer_gives_two_distinct_outputs_in_a_graph():
    content, position = SharedRelativeBiases(NUM_HEADS, HEAD_DIM)(keras.Input((3, 8)))
    assert content is not position


def test_changing_the_shared_content_bias_changes_the_output():
    backbone = _backbone(per_layer_biases=False, num_layers=1)
    inputs = _inputs(backbone)
    before = _output(backbone, inputs)
    backbone.shared_biases.content_bias.assign(np.full((NUM_HEADS, HEAD_DIM), 5.0, "float32"))
    after = _output(backbone, inputs)
    assert np.abs(after - before).max() > 1e-3


def test_shared_biases_equal_per_layer_biases_that_are_all_the_same():
    shared = _backbone(per_layer_biases=False)
    untied = _backbone(per_layer_biases=True)
    content, position = _biases(seed=1)
    shared.shared_biases.content_bias.assign(content)
    shared.shared_biases.position_bias.assign(position)
    untied_variables = {variable.path: variable for variable in untied.weights}
    for variable in shared.weights:
        if not variable.path.startswith("shared_biases/"):
            untied_variables.pop(variable.path).assign(variable)
    for path, variable in untied_variables.items():  # only the layers' own u and v are left
        assert path.endswith(("self_attention/content_bias", "self_attention/position_bias")), path
        variable.assign(content if path.endswith("content_bias") else position)

    inputs = _inputs(shared)
    np.testing.assert_allclose(_output(shared, inputs), _output(untied, inputs), atol=ATOL, rtol=0)


def _checkpoint(directory, untie_r, content, position):
    """The fixture's transformers checkpoint with u, v = `content`,
    `position`: once (`transformer.r_w_bias`) if not `untie_r`, else in
    every layer."""
    directory.mkdir()
    config = json.loads((FIXTURE / "config.json").read_text())
    config["untie_r"] = untie_r
    (directory / "config.json").write_text(json.dumps(config))
    tensors = {
        name: tensor for name, tensor in load_file(str(FIXTURE / "model.safetensors")).items()
        if not name.endswith(("dec_attn.r_w_bias", "dec_attn.r_r_bias"))
    }
    if untie_r:
        for layer in range(config["n_layer"]):
            tensors[f"transformer.layers.{layer}.dec_attn.r_w_bias"] = content
            tensors[f"transformer.layers.{layer}.dec_attn.r_r_bias"] = position
    else:
        tensors["transformer.r_w_bias"], tensors["transformer.r_r_bias"] = content, position
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    return directory


def test_converted_untie_r_false_checkpoint_equals_the_untied_one_with_replicated_biases(tmp_path):
    config = json.loads((FIXTURE / "config.json").read_text())
    rng = np.random.default_rng(2)
    content, position = (
        (0.5 * rng.normal(size=(config["n_head"], config["d_head"]))).astype("float32") for _ in range(2)
    )
    tied = TransformerXLCausalLM.from_preset(
        str(_checkpoint(tmp_path / "tied", False, content, position)), preprocessor=None
    )
    untied = TransformerXLCausalLM.from_preset(
        str(_checkpoint(tmp_path / "untied", True, content, position)), preprocessor=None
    )
    assert not tied.backbone.per_layer_biases and untied.backbone.per_layer_biases
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(tied.backbone.shared_biases.content_bias), content)

    ids = load_file(str(FIXTURE / "inputs.safetensors"))["input_ids"].astype("int32")[:, : config["tgt_len"]]
    tied_result, untied_result = tied.score(ids), untied.score(ids)
    for key in ("sequence_output", "log_probabilities"):
        np.testing.assert_allclose(
            keras.ops.convert_to_numpy(tied_result[key]), keras.ops.convert_to_numpy(untied_result[key]),
            atol=ATOL, rtol=0, err_msg=key,
        )
