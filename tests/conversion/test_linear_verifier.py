"""The GPT verifier on the linear-attention presets (`linear_transformer_*`:
GPT-2 weights with `config_overrides={"attention": "linear", ...}`): the
reference is transformers' GPT-2 with its attention function replaced by
causal linear attention written in torch from the paper
(`linear_attention_reference.causal_linear_attention_reference`)."""

import json
import types
from pathlib import Path

import numpy as np
import pytest
import torch

import attention_zoo_keras as azk
from attention_zoo_keras.conversion import linear_attention_reference
from attention_zoo_keras.conversion import verifiers
from attention_zoo_keras.hub import catalog
from tests.support.conversion_cli import perturb_a_kernel
from tests.support.conversion_cli import run

TOLERANCE = 1e-4
LINEAR_PRESETS = ("linear_transformer_gpt2", "linear_transformer_gpt2_medium", "linear_transformer_distilgpt2")
BACKBONE_REFERENCE = "transformers.GPT2Model with linear attention (Katharopoulos et al. 2020, elu+1)"
LM_REFERENCE = "transformers.GPT2LMHeadModel with linear attention (Katharopoulos et al. 2020, elu+1)"


def parity_of(directory):
    return json.loads((Path(directory) / "metadata.json").read_text())["parity"]


def numpy_causal_linear_attention(query, key, value, eps=1e-6, key_mask=None):
    """The paper's RNN form (eqs. 18-20), position by position, in float64:
    S_i = S_{i-1} + φ(K_i)V_iᵀ, z_i = z_{i-1} + φ(K_i), V'_i = φ(Q_i)ᵀS_i / (φ(Q_i)ᵀz_i + eps);
    `(batch, heads, length, dim)` arrays, `key_mask` `(batch, length)`."""
    phi = lambda x: np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))  # noqa: E731 - elu(x) + 1
    query, key, value = (np.asarray(t, "float64") for t in (query, key, value))
    batch, heads, length, _ = query.shape
    output = np.zeros(value.shape)
    for b in range(batch):
        for h in range(heads):
            state = np.zeros((key.shape[-1], value.shape[-1]))
            normaliser = np.zeros(key.shape[-1])
            for i in range(length):
                if key_mask is None or key_mask[b, i]:
                    state += np.outer(phi(key[b, h, i]), value[b, h, i])
                    normaliser += phi(key[b, h, i])
                q = phi(query[b, h, i])
                output[b, h, i] = q @ state / (q @ normaliser + eps)
    return output


@pytest.fixture
def linear_preset(local_hub, tiny_gpt2_checkpoints, capsys, tmp_path):
    """`linear_transformer_gpt2` converted (and verified) from the tiny GPT-2
    served as openai-community/gpt2: `(directory, stdout)`."""
    local_hub.add_repo("openai-community/gpt2", tiny_gpt2_checkpoints["model"])
    out = tmp_path / "linear"
    code, stdout, stderr = run(capsys, "convert", "linear_transformer_gpt2", "--out", out)
    assert code == 0, stderr
    return out, stdout


# ------------------------------------------------------- the reference itself


@pytest.mark.parametrize("padded", [False, True])
def test_the_torch_reference_is_the_papers_formula(padded):
    rng = np.random.default_rng(1)
    query, key, value = (2.0 * rng.normal(size=(2, 3, 7, 4)) for _ in range(3))  # both branches of elu+1
    key_mask = np.ones((2, 7), bool)
    key_mask[1, 4:] = False
    expected = numpy_causal_linear_attention(query, key, value, key_mask=key_mask if padded else None)

    mask = torch.tensor(key_mask)[:, None, None, :] if padded else None  # (batch, 1, 1, keys), True: real
    actual = linear_attention_reference.causal_linear_attention_reference(
        *(torch.tensor(t, dtype=torch.float32) for t in (query, key, value)), attention_mask=mask
    )

    assert actual.dtype == torch.float32 and tuple(actual.shape) == (2, 3, 7, 4)
    np.testing.assert_allclose(actual.numpy(), expected, rtol=1e-5, atol=1e-6)
    # No 1/sqrt(d) scaling: scaling the queries changes the output.
    scaled = linear_attention_reference.causal_linear_attention_reference(
        *(torch.tensor(t, dtype=torch.float32) for t in (query / 2.0, key, value)), attention_mask=mask
    )
    assert np.max(np.abs(scaled.numpy() - expected)) > 1e-2


def test_the_reference_is_registered_as_a_transformers_attention_function():
    import transformers

    name = linear_attention_reference.register_linear_reference(transformers)
    assert transformers.AttentionInterface()[name] is linear_attention_reference._linear_attention_forward
    query = torch.randn(1, 2, 5, 3)
    output, weights = linear_attention_reference._linear_attention_forward(None, query, query, query, None, scaling=0.5)
    assert weights is None and tuple(output.shape) == (1, 5, 2, 3)  # (batch, length, heads, dim)
    with pytest.raises(ValueError, match="dropout"):
        linear_attention_reference._linear_attention_forward(None, query, query, query, None, dropout=0.1)


# -------------------------------------------------------- which presets


def test_the_linear_presets_have_a_verifier(capsys):
    for name in LINEAR_PRESETS:
        entry = azk.list_presets()[name]
        assert entry["config_overrides"]["attention"] == "linear"
        assert verifiers.unverifiable_reason(entry) is None, name
    code, out, _ = run(capsys, "list", "--family", "gpt")
    assert code == 0
    lines = {line.split()[0]: line.split() for line in out.splitlines()[2:]}
    for name in LINEAR_PRESETS:
        assert lines[name][-1] == "yes"


@pytest.mark.parametrize(
    "overrides, unhandled",
    [
        ({"attention": "linear", "attention_dropout": 0.0, "num_layers": 1}, "num_layers"),
        ({"attention": "relative"}, "attention"),
        ({"attention": "linear", "attention_dropout": 0.1}, "attention_dropout"),
    ],
)
def test_an_override_the_verifier_does_not_handle_has_no_verifier(overrides, unhandled):
    with pytest.raises(verifiers.NoVerifierError, match=f"changes the architecture of its source \\({unhandled}\\)"):
        verifiers.verifier_for("gpt", "GPTBackbone", overrides)
    assert verifiers.unverifiable_reason({"family": "gpt", "class_name": "GPTBackbone", "config_overrides": overrides})
    # Other families handle no override at all.
    with pytest.raises(verifiers.NoVerifierError, match="attention"):
        verifiers.verifier_for("bert", "BertBackbone", {"attention": "linear"})


def test_a_preset_with_an_unhandled_override_is_not_verified(
    local_hub, tiny_gpt2_checkpoints, capsys, tmp_path, monkeypatch
):
    entry = {
        **catalog.get_preset("linear_transformer_gpt2"),
        "name": "one_layer_linear",
        # An architecture change the weights still fit (strict loading refuses dropping layers).
        "config_overrides": {"attention": "linear", "attention_dropout": 0.0, "layer_norm_epsilon": 1e-3},
    }
    monkeypatch.setattr(catalog, "_catalog", lambda: {"one_layer_linear": entry})
    local_hub.add_repo("openai-community/gpt2", tiny_gpt2_checkpoints["model"])

    code, stdout, err = run(capsys, "convert", "one_layer_linear", "--out", tmp_path / "n")

    assert code == 0, err
    assert "not verified" in stdout and "(layer_norm_epsilon)" in stdout
    assert "parity" not in json.loads((tmp_path / "n" / "metadata.json").read_text())


@pytest.mark.parametrize(
    "attention, options, verified",
    [
        ("linear", {}, True),
        ("linear", {"chunk_size": 4}, True),
        ("linear", {"feature_map": "elu_plus_one", "eps": 1e-6}, True),
        ("linear", {"eps": 1e-3}, False),
        ("linear", {"feature_map": "relu"}, False),
        ("relative", {}, False),
        ("softmax", {}, True),
    ],
)
def test_the_gpt_verifier_runs_only_attentions_it_has_a_reference_for(attention, options, verified):
    backbone = types.SimpleNamespace(attention=attention, attention_options=options)
    if verified:
        assert verifiers._gpt_attention(backbone) == attention
    else:
        with pytest.raises(verifiers.NoVerifierError, match=attention):
            verifiers._gpt_attention(backbone)


# ------------------------------------------------------------- parity


def test_convert_a_linear_preset_verifies_it_against_the_linear_reference(linear_preset):
    out, stdout = linear_preset
    assert "not verified" not in stdout and f"parity against {BACKBONE_REFERENCE}: passed" in stdout
    parity = parity_of(out)
    assert parity["passed"] is True and parity["reference"] == BACKBONE_REFERENCE
    assert parity["source"] == "linear_transformer_gpt2"
    assert set(parity["max_abs_difference"]) == {"sequence_output"}
    assert all(0 <= value < TOLERANCE for value in parity["max_abs_difference"].values())
    assert "right-padded" in parity["inputs"] and "real positions" in parity["inputs"]
    card = (out / "README.md").read_text()
    assert f"`{BACKBONE_REFERENCE}`" in card[card.index("## Parity") :]
    assert azk.models.GPTBackbone.from_preset(str(out)).attention == "linear"


def test_verify_against_the_plain_checkpoint_sees_the_linear_attention(linear_preset, capsys):
    out, _ = linear_preset
    # The hub source has no overrides: the verifier reads the model's attention.
    code, stdout, stderr = run(capsys, "verify", out, "--reference", "hf://openai-community/gpt2")
    assert code == 0, stderr
    assert f"parity against {BACKBONE_REFERENCE}" in stdout
    parity = parity_of(out)
    assert parity["passed"] is True and parity["reference"] == BACKBONE_REFERENCE
    assert parity["source"] == "hf://openai-community/gpt2"
    assert parity["max_abs_difference"]["sequence_output"] < TOLERANCE


def test_the_softmax_reference_would_fail_the_linear_preset(linear_preset, monkeypatch):
    """The check can fail: the same model against plain (softmax) GPT-2 is
    far outside the tolerance."""
    out, _ = linear_preset
    model = azk.models.GPTBackbone.from_preset(str(out))
    source = azk.hub.source.PresetSource.of("hf://openai-community/gpt2")
    linear = verifiers.verify_gpt(model, source)
    monkeypatch.setattr(verifiers, "_gpt_attention", lambda backbone: "softmax")
    softmax = verifiers.verify_gpt(model, source)
    assert softmax["reference"] == "transformers.GPT2Model"
    assert linear["max_abs_difference"]["sequence_output"] < TOLERANCE
    assert softmax["max_abs_difference"]["sequence_output"] > 100 * TOLERANCE


def test_verify_fails_on_a_perturbed_weight(linear_preset, capsys):
    out, _ = linear_preset
    perturb_a_kernel(out)

    code, stdout, stderr = run(capsys, "verify", out, "--reference", "linear_transformer_gpt2")

    assert code == 1
    assert "FAILED" in stdout and "parity FAILED" in stderr
    parity = parity_of(out)
    assert parity["passed"] is False and parity["reference"] == BACKBONE_REFERENCE
    assert parity["max_abs_difference"]["sequence_output"] > TOLERANCE


def test_a_linear_causal_lm_is_verified_against_the_lm_head_model(
    local_hub, tiny_gpt2_checkpoints, capsys, tmp_path, monkeypatch
):
    entry = {**catalog.get_preset("linear_transformer_gpt2"), "name": "linear_lm", "class_name": "GPTCausalLM"}
    monkeypatch.setattr(catalog, "_catalog", lambda: {"linear_lm": entry})
    local_hub.add_repo("openai-community/gpt2", tiny_gpt2_checkpoints["lm"])

    code, stdout, stderr = run(capsys, "convert", "linear_lm", "--out", tmp_path / "lm")

    assert code == 0, stderr
    assert f"parity against {LM_REFERENCE}: passed" in stdout
    parity = parity_of(tmp_path / "lm")
    assert parity["passed"] is True and parity["reference"] == LM_REFERENCE
    assert set(parity["max_abs_difference"]) == {"logits"} and parity["max_abs_difference"]["logits"] < TOLERANCE
    assert azk.models.GPTCausalLM.from_preset(str(tmp_path / "lm")).backbone.attention == "linear"
