"""Converted Transformer-XL against `transformers` 4.37.2 (the last release
that runs it), through the golden outputs in `tests/fixtures/transfo_xl`
(see its README): adaptive input and softmax with `div_val` 2, `same_length`,
`clamp_len` below the attended length, per-layer biases, three consecutive
segments. Tolerance: 1e-4 absolute, fp32."""

from pathlib import Path

import keras
import numpy as np
import pytest
from safetensors.numpy import load_file

from attention_zoo_keras.models.transformer_xl import TransformerXLBackbone
from attention_zoo_keras.models.transformer_xl import TransformerXLCausalLM

ATOL = 1e-4
FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "transfo_xl"
SEGMENTS = 3


@pytest.fixture(scope="module")
def reference():
    if not FIXTURE.is_dir():
        pytest.fail(f"The Transformer-XL fixture is missing: {FIXTURE} (it ships in tests/fixtures).")
    return load_file(str(FIXTURE / "inputs.safetensors")), load_file(str(FIXTURE / "outputs.safetensors"))


@pytest.fixture(scope="module")
def lm():
    return TransformerXLCausalLM.from_preset(str(FIXTURE), preprocessor=None)


def _numpy(x):
    return np.asarray(keras.ops.convert_to_numpy(x))


def _in_transformers_order(losses, labels, cutoffs):
    """Our per-token losses `(batch, length)` in the order `transformers`
    returns them: its adaptive softmax (with the default `keep_order=False`)
    writes the flattened losses cluster by cluster — first every token of
    the shortlist, then of each tail cluster, each in position order — and
    only then views them as `(batch, length)`."""
    flat_losses, flat_labels = losses.reshape(-1), labels.reshape(-1)
    clusters = np.searchsorted(np.asarray(cutoffs), flat_labels, side="right")
    return flat_losses[np.argsort(clusters, kind="stable")].reshape(losses.shape)


def test_config_converted_from_the_checkpoint(lm):
    backbone = lm.backbone
    assert (backbone.cutoffs, backbone.div_val, backbone.clamp_len, backbone.mem_len) == ([20, 40, 70], 2, 9, 6)
    assert backbone.same_length and backbone.per_layer_biases and not backbone.norm_first
    assert lm.tie_projections == [False, True, True, True]


def test_three_segments_match_transformers(lm, reference):
    inputs, outputs = reference
    token_ids = inputs["input_ids"].astype("int32")
    batch, total = token_ids.shape
    length = total // SEGMENTS
    memory = lm.backbone.initial_memory(batch)  # transformers' zero memory for segment 0 (fixture README)
    for segment in range(SEGMENTS):
        ids = token_ids[:, segment * length : (segment + 1) * length]
        result = lm.score(ids, memory)
        log_probabilities = _numpy(result["log_probabilities"])
        np.testing.assert_allclose(
            log_probabilities, outputs[f"seg{segment}.prediction_scores"], atol=ATOL, rtol=0,
            err_msg=f"log-probabilities of segment {segment}",
        )
        np.testing.assert_allclose(
            _numpy(result["sequence_output"]), outputs[f"seg{segment}.last_hidden_state"], atol=ATOL, rtol=0,
            err_msg=f"hidden states of segment {segment}",
        )
        losses = -_numpy(lm.lm_head.token_log_probabilities(result["sequence_output"][:, :-1], ids[:, 1:]))
        losses = _in_transformers_order(losses, ids[:, 1:], lm.backbone.cutoffs)
        np.testing.assert_allclose(losses, outputs[f"seg{segment}.losses"], atol=ATOL, rtol=0,
                                   err_msg=f"per-token losses of segment {segment}")
        memory = result["memory"]
        for layer in range(lm.backbone.num_layers):
            theirs = outputs[f"seg{segment}.mems.{layer}"].transpose(1, 0, 2)  # time-major there
            np.testing.assert_allclose(_numpy(memory[:, layer]), theirs, atol=ATOL, rtol=0,
                                       err_msg=f"memory of layer {layer} after segment {segment}")


def test_backbone_alone_loads_the_same_weights(lm, reference):
    inputs, outputs = reference
    backbone = TransformerXLBackbone.from_preset(str(FIXTURE))
    ids = inputs["input_ids"][:, :5].astype("int32")
    out = backbone({"token_ids": ids, "memory": backbone.initial_memory(ids.shape[0])})
    np.testing.assert_allclose(_numpy(out["sequence_output"]), outputs["seg0.last_hidden_state"], atol=ATOL, rtol=0)
