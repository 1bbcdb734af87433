"""`python -m conversion`: list, convert (named presets, hub and local
sources, --all), verify (parity recorded in metadata.json and the model
card) and publish, on tiny random `transformers` checkpoints."""

import json
import os
import shutil
import subprocess
import types
import sys
from pathlib import Path

import keras
import numpy as np
import pytest

import attention_zoo_keras as azk
from attention_zoo_keras.hub.catalog import presets_markdown
from attention_zoo_keras.conversion import cli
from attention_zoo_keras.conversion import verifiers
from attention_zoo_keras.hub import catalog
from tests.support.conversion_cli import perturb_a_kernel
from tests.support.conversion_cli import run

ROOT = Path(__file__).resolve().parents[2]

TOLERANCE = 1e-4
BERT_TINY_REPO = "google/bert_uncased_L-2_H-128_A-2"  # where presets/bert_tiny.json points


def metadata(directory):
    return json.loads((Path(directory) / "metadata.json").read_text())


def assert_parity_recorded(directory, reference, outputs):
    parity = metadata(directory)["parity"]
    assert parity["passed"] is True and parity["reference"] == reference
    assert set(parity["max_abs_difference"]) == set(outputs)
    assert all(0 <= value < TOLERANCE for value in parity["max_abs_difference"].values())
    assert parity["tolerance"] == TOLERANCE and parity["dtype"] == "float32"
    import keras

    assert parity["backend"] == keras.backend.backend()
    versions = parity["versions"]
    assert versions["attention_zoo_keras"] == azk.__version__ and versions["keras"] == keras.__version__
    assert "transformers" in versions and "torch" in versions
    card = (Path(directory) / "README.md").read_text()
    assert card.startswith("---\n") and "## Configuration" in card  # the card is still whole
    section = card[card.index("## Parity") :]
    assert f"`{reference}`" in section and "passed" in section and parity["backend"] in section
    for name in outputs:
        assert f"`{name}`" in section
    return parity


# --------------------------------------------------------------------- list


def test_list_markdown_prints_the_catalog_table(capsys):
    code, out, _ = run(capsys, "list", "--markdown", "--family", "vit")
    assert code == 0
    assert out == presets_markdown("vit")


def test_list_shows_every_preset_with_class_source_and_verifier(capsys):
    code, out, _ = run(capsys, "list")
    assert code == 0
    table, _, notes = out.partition("\n\n")
    lines = {line.split()[0]: line.split() for line in table.splitlines()[2:]}
    assert set(lines) == set(azk.list_presets())
    assert lines["bert_tiny"] == ["bert_tiny", "BertBackbone", "bert", f"hf://{BERT_TINY_REPO}", "yes"]
    assert lines["vit_base_patch16_224"][-1] == "yes" and lines["transformer_opus_mt_en_de"][-1] == "yes"
    assert lines["gpt2"][-1] == "yes"
    # GPT-2's weights with linear attention: verified against GPT-2 running the linear-attention formula.
    assert lines["linear_transformer_gpt2"][-1] == "yes"
    assert lines["vilbert_multitask"][-1] == "no" and lines["transformer_xl_wt103"][-1] == "no"
    # ... and says why.
    assert "not verifiable: transformer_xl_wt103: transformers removed Transformer-XL" in notes
    assert "not verifiable: vilbert_conceptual_captions, vilbert_multitask: the reference is the authors'" in notes

    code, out, _ = run(capsys, "list", "--family", "vit")
    assert code == 0 and all(" vit " in line for line in out.splitlines()[2:]) and "bert_tiny" not in out


# ------------------------------------------------------ convert and verify


@pytest.mark.parametrize(
    ("checkpoint", "class_name", "reference", "outputs"),
    [
        ("bert/model", "BertBackbone", "transformers.BertModel", {"sequence_output", "pooled_output"}),
        ("bert/masked_lm", "BertMaskedLM", "transformers.BertForMaskedLM", {"logits"}),
        ("bert/classifier", "BertTextClassifier", "transformers.BertForSequenceClassification", {"logits"}),
        ("gpt/lm", "GPTCausalLM", "transformers.GPT2LMHeadModel", {"logits"}),
        ("vit/model", "ViTBackbone", "transformers.ViTModel", {"sequence_output", "pooled_output"}),
        ("vit/classifier", "ViTImageClassifier", "transformers.ViTForImageClassification", {"logits"}),
        ("marian", "TransformerSeq2SeqLM", "transformers.MarianMTModel", {"logits"}),
    ],
)
def test_convert_and_verify_a_local_checkpoint(
    request, capsys, tmp_path, checkpoint, class_name, reference, outputs
):
    family, _, name = checkpoint.partition("/")
    fixture = {
        "bert": "tiny_bert_checkpoints", "gpt": "tiny_gpt2_checkpoints",
        "vit": "tiny_vit_checkpoints", "marian": "tiny_marian_checkpoint",
    }[family]
    checkpoints = request.getfixturevalue(fixture)
    source = checkpoints[name] if name else checkpoints
    out = tmp_path / "native"

    code, stdout, stderr = run(capsys, "convert", source, "--class", class_name, "--out", out)

    assert code == 0, stderr
    assert "passed" in stdout
    assert json.loads((out / "config.json").read_text())["class_name"] == class_name
    parity = assert_parity_recorded(out, reference, outputs)
    assert parity["source"] == str(source)
    assert (out / "preprocessor.json").is_file()  # a backbone carries its family's preprocessor

    # `verify` on its own re-runs it, and replaces the record (one Parity section).
    code, stdout, _ = run(capsys, "verify", out, "--reference", source)
    assert code == 0 and "passed" in stdout
    assert_parity_recorded(out, reference, outputs)
    assert (out / "README.md").read_text().count("## Parity") == 1


def test_a_converted_backbone_carries_the_tokenizer_its_tasks_need(tiny_bert_checkpoints, capsys, tmp_path):
    source = tiny_bert_checkpoints["model"]
    assert run(capsys, "convert", source, "--class", "BertBackbone", "--out", tmp_path / "native")[0] == 0
    assert (tmp_path / "native" / "tokenizer.json").is_file()

    ours = azk.models.BertTextClassifier.from_preset(str(tmp_path / "native"), num_classes=2)
    theirs = azk.models.BertTextClassifier.from_preset(str(source), num_classes=2)
    texts = ["the cat sat on the mat", "a dog"]
    for key, value in theirs.preprocessor(texts).items():
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(ours.preprocessor(texts)[key]),
                                      keras.ops.convert_to_numpy(value))


def test_a_checkpoint_without_tokenizer_files_converts_and_says_so(tiny_bert_checkpoints, capsys, tmp_path):
    source = tmp_path / "weights_only"
    source.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(tiny_bert_checkpoints["model"] / name, source / name)
    code, stdout, _ = run(capsys, "convert", source, "--class", "BertBackbone", "--out", tmp_path / "native")
    assert code == 0 and "has no tokenizer files; the preset has no preprocessor" in stdout
    assert not (tmp_path / "native" / "tokenizer.json").exists()
    azk.models.BertBackbone.from_preset(str(tmp_path / "native"))


def test_convert_and_verify_a_reformer(capsys, tmp_path):
    import transformers

    from tests.support.tiny_checkpoints import perturbed

    config = transformers.ReformerConfig(
        hidden_size=16, num_attention_heads=2, attention_head_size=8, feed_forward_size=32, lsh_attn_chunk_length=4,
        local_attn_chunk_length=4, axial_pos_shape=[4, 6], axial_pos_embds_dim=[8, 8], max_position_embeddings=24,
        is_decoder=True, pad_token_id=0, hidden_dropout_prob=0.0, local_attention_probs_dropout_prob=0.0,
        vocab_size=258, attn_layers=["local", "lsh"], num_hashes=2, num_buckets=[2, 2], eos_token_id=1,
    )
    perturbed(transformers.ReformerModelWithLMHead(config), 2).save_pretrained(tmp_path / "reformer")

    code, _, stderr = run(capsys, "convert", tmp_path / "reformer", "--class", "ReformerCausalLM", "--out", tmp_path / "n")

    assert code == 0, stderr
    parity = assert_parity_recorded(tmp_path / "n", "transformers.ReformerModelWithLMHead", {"logits"})
    assert "2 sequences of 24" in parity["inputs"]  # the longest the positions and chunks allow


def test_convert_a_hub_source(local_hub, tiny_gpt2_checkpoints, capsys, tmp_path):
    local_hub.add_repo("zoo-org/tiny-gpt2", tiny_gpt2_checkpoints["model"])
    code, _, stderr = run(capsys, "convert", "hf://zoo-org/tiny-gpt2", "--class", "GPTBackbone", "--out", tmp_path / "n")
    assert code == 0, stderr
    parity = assert_parity_recorded(tmp_path / "n", "transformers.GPT2Model", {"sequence_output"})
    assert parity["source"] == "hf://zoo-org/tiny-gpt2"
    assert ("GET", "/zoo-org/tiny-gpt2/resolve/main/model.safetensors") in local_hub.requests


def test_convert_a_named_preset_from_the_hub(local_hub, tiny_bert_checkpoints, capsys, tmp_path):
    local_hub.add_repo(BERT_TINY_REPO, tiny_bert_checkpoints["model"])  # the tiny model, where bert_tiny points

    code, stdout, stderr = run(capsys, "convert", "bert_tiny", "--out", tmp_path / "bert_tiny")

    assert code == 0, stderr
    parity = assert_parity_recorded(tmp_path / "bert_tiny", "transformers.BertModel", {"sequence_output", "pooled_output"})
    assert parity["source"] == "bert_tiny"
    # The card names the checkpoint: YAML base_model and license (from the preset), and a Source section.
    assert metadata(tmp_path / "bert_tiny")["source"] == f"hf://{BERT_TINY_REPO}"
    card = (tmp_path / "bert_tiny" / "README.md").read_text()
    front_matter = card.split("---\n")[1].splitlines()
    assert f"base_model: {BERT_TINY_REPO}" in front_matter
    assert f"license: {catalog.get_preset('bert_tiny')['license']}" in front_matter
    assert f"## Source\n\nConverted from `hf://{BERT_TINY_REPO}`" in card
    assert card.index("## Source") < card.index("## Parity")
    assert catalog.get_preset("bert_tiny")["description"] in card
    assert "BERT (Devlin et al., 2019)" in card  # the architecture
    assert ("GET", f"/{BERT_TINY_REPO}/resolve/main/model.safetensors") in local_hub.requests
    backbone = azk.models.BertBackbone.from_preset(str(tmp_path / "bert_tiny"))
    assert backbone.hidden_dim == 32


def test_no_verify_saves_without_a_parity_record(tiny_bert_checkpoints, capsys, tmp_path):
    code, _, _ = run(
        capsys, "convert", tiny_bert_checkpoints["model"], "--class", "BertBackbone", "--out", tmp_path / "n", "--no-verify"
    )
    assert code == 0 and "parity" not in metadata(tmp_path / "n")
    assert "## Parity" not in (tmp_path / "n" / "README.md").read_text()


def test_convert_all_continues_past_failures(local_hub, tiny_bert_checkpoints, capsys, tmp_path, monkeypatch):
    local_hub.add_repo(BERT_TINY_REPO, tiny_bert_checkpoints["model"])
    entries = {
        "bert_tiny": catalog.get_preset("bert_tiny"),
        "a_missing_one": {**catalog.get_preset("bert_tiny"), "name": "a_missing_one", "source": "hf://zoo-org/missing"},
        "bert_tiny_again": {**catalog.get_preset("bert_tiny"), "name": "bert_tiny_again"},
    }
    monkeypatch.setattr(catalog, "_catalog", lambda: entries)

    code, stdout, stderr = run(capsys, "convert", "--all", "--out", tmp_path / "all")

    assert code == 1
    assert "converted 2 of 3 presets" in stdout
    assert "1 failed" in stderr and "a_missing_one: PresetFileError" in stderr and "repository not found" in stderr
    assert "converting" in stderr  # the progress bar
    assert sorted(path.name for path in (tmp_path / "all").iterdir()) == ["bert_tiny", "bert_tiny_again"]
    for name in ("bert_tiny", "bert_tiny_again"):
        assert metadata(tmp_path / "all" / name)["parity"]["passed"] is True


def test_convert_all_succeeds_when_every_preset_does(local_hub, tiny_bert_checkpoints, capsys, tmp_path, monkeypatch):
    local_hub.add_repo(BERT_TINY_REPO, tiny_bert_checkpoints["model"])
    entries = {name: catalog.get_preset(name) for name in ("bert_tiny", "vilbert_multitask")}
    monkeypatch.setattr(catalog, "_catalog", lambda: entries)
    code, stdout, _ = run(capsys, "convert", "--all", "--out", tmp_path / "all", "--no-verify")
    assert code == 0 and "converted 1 of 1 presets" in stdout
    # ViLBERT's presets come from the authors' files, through their own script.
    assert "skipped vilbert_multitask: its source is the native preset converted from the ViLBERT authors'" in stdout
    assert "azk-convert vilbert" in stdout and sorted(p.name for p in (tmp_path / "all").iterdir()) == ["bert_tiny"]


def test_verify_fails_on_a_perturbed_weight(tiny_bert_checkpoints, capsys, tmp_path):
    source = tiny_bert_checkpoints["classifier"]
    out = tmp_path / "native"
    assert run(capsys, "convert", source, "--class", "BertTextClassifier", "--out", out)[0] == 0
    perturb_a_kernel(out)

    code, stdout, stderr = run(capsys, "verify", out, "--reference", source)

    assert code == 1
    assert "FAILED" in stdout and "parity FAILED" in stderr and "tolerance 0.0001" in stderr
    parity = metadata(out)["parity"]
    assert parity["passed"] is False and parity["max_abs_difference"]["logits"] > TOLERANCE
    card = (out / "README.md").read_text()
    assert card.count("## Parity") == 1 and "FAILED" in card[card.index("## Parity") :]


def test_verify_against_a_reference_of_another_family_is_a_usage_error(
    tiny_bert_checkpoints, tiny_gpt2_checkpoints, capsys, tmp_path
):
    """The reference is checked before anything is loaded into a
    `transformers` class of the wrong family (which built a random GPT-2 and
    then failed with an IndexError)."""
    out = tmp_path / "native"
    assert run(capsys, "convert", tiny_bert_checkpoints["classifier"], "--class", "BertTextClassifier", "--out", out,
               "--no-verify")[0] == 0
    code, stdout, err = run(capsys, "verify", out, "--reference", tiny_gpt2_checkpoints["lm"])
    assert code == 2 and stdout == ""
    assert "is a transformers 'gpt2' checkpoint (gpt), but the preset in" in err and "is a bert model" in err

    code, _, err = run(capsys, "verify", out, "--reference", out)
    assert code == 2 and "is a preset of attention_zoo_keras, not a transformers checkpoint" in err


def test_converting_a_preset_of_this_library_says_what_it_is(tiny_bert_checkpoints, capsys, tmp_path):
    native = tmp_path / "native"
    assert run(capsys, "convert", tiny_bert_checkpoints["model"], "--class", "BertBackbone", "--out", native,
               "--no-verify")[0] == 0
    code, _, err = run(capsys, "convert", native, "--class", "BertBackbone", "--out", tmp_path / "again")
    assert code == 1 and "is already a preset of attention_zoo_keras, not a transformers checkpoint" in err
    assert "neither" not in err


def test_convert_with_failing_parity_exits_non_zero(tiny_bert_checkpoints, capsys, tmp_path, monkeypatch):

    original = verifiers.VERIFIERS["bert"]

    def off_by_a_bit(model, source):
        result = original(model, source)
        result["max_abs_difference"] = {name: value + 1e-3 for name, value in result["max_abs_difference"].items()}
        return result

    monkeypatch.setitem(verifiers.VERIFIERS, "bert", off_by_a_bit)
    out = tmp_path / "native"
    code, _, stderr = run(capsys, "convert", tiny_bert_checkpoints["model"], "--class", "BertBackbone", "--out", out)
    assert code == 1 and "parity FAILED" in stderr and f"nothing was written to {out}" in stderr
    assert not out.exists() and list(tmp_path.iterdir()) == []  # no staging directory left behind either


def test_a_failed_conversion_leaves_an_earlier_preset_intact(tiny_bert_checkpoints, capsys, tmp_path, monkeypatch):

    out = tmp_path / "native"
    assert run(capsys, "convert", tiny_bert_checkpoints["model"], "--class", "BertBackbone", "--out", out)[0] == 0
    before = {path.name: path.read_bytes() for path in out.iterdir()}
    monkeypatch.setitem(verifiers.VERIFIERS, "bert", lambda model, source: {
        "reference": "transformers.BertModel", "max_abs_difference": {"sequence_output": 1.0}})
    assert run(capsys, "convert", tiny_bert_checkpoints["model"], "--class", "BertBackbone", "--out", out)[0] == 1
    assert {path.name: path.read_bytes() for path in out.iterdir()} == before
    assert [path.name for path in tmp_path.iterdir()] == ["native"]


def test_a_bin_checkpoint_is_read_with_weights_only(tiny_bert_checkpoints, capsys, tmp_path):
    import torch
    import transformers

    source = tmp_path / "bin_checkpoint"
    shutil.copytree(tiny_bert_checkpoints["masked_lm"], source)
    model = transformers.BertForMaskedLM.from_pretrained(source)
    (source / "model.safetensors").unlink()
    torch.save(model.state_dict(), source / "pytorch_model.bin")
    with pytest.raises(azk.hub.PresetFileError, match="never unpickled at run time"):
        azk.models.BertMaskedLM.from_preset(str(source))

    code, _, stderr = run(capsys, "convert", source, "--class", "BertMaskedLM", "--out", tmp_path / "native")
    assert code == 0, stderr
    assert_parity_recorded(tmp_path / "native", "transformers.BertForMaskedLM", {"logits"})
    converted = azk.models.BertMaskedLM.from_preset(str(tmp_path / "native"))
    reference = azk.models.BertMaskedLM.from_preset(str(tiny_bert_checkpoints["masked_lm"]))
    features = reference.preprocessor.pack(["the cat sat on the mat"])
    features["mask_positions"] = np.array([[1, 2, 3]], "int32")
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(converted(features)), keras.ops.convert_to_numpy(reference(features)), atol=1e-6
    )


class Payload:
    """A class a pickled checkpoint names: unpickling it would import and
    build it (where a hostile file would call `os.system`)."""


def test_a_bin_checkpoint_holding_objects_is_refused_without_unsafe_advice(tiny_bert_checkpoints, capsys, tmp_path):
    import torch

    source = tmp_path / "malicious"
    shutil.copytree(tiny_bert_checkpoints["model"], source)
    (source / "model.safetensors").unlink()
    state = {"bert.embeddings.word_embeddings.weight": torch.zeros(2, 2), "payload": Payload()}
    torch.save(state, source / "pytorch_model.bin")
    code, _, stderr = run(capsys, "convert", source, "--class", "BertBackbone", "--out", tmp_path / "native")
    assert code == 1
    assert f"'{source / 'pytorch_model.bin'}' holds the Python object `{__name__}.Payload`" in stderr
    assert "torch.load(weights_only=True)" in stderr and "not loaded" in stderr
    # torch's own message says re-running with weights_only=False "will likely succeed" and offers to
    # allow-list the class: advice to run code from an untrusted file, never passed on.
    assert "weights_only=False" not in stderr and "`weights_only` set to `False`" not in stderr
    assert "safe_globals" not in stderr and "trust" not in stderr
    assert not (tmp_path / "native").exists()


def test_convert_refuses_an_out_directory_that_is_not_a_preset(tiny_bert_checkpoints, capsys, tmp_path):
    """A user's folder is never emptied: `--out` holding other files is
    refused before anything is converted, and keeps them."""
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    code, stdout, err = run(capsys, "convert", tiny_bert_checkpoints["model"], "--class", "BertBackbone", "--out", out)
    assert code == 2 and stdout == ""
    assert f"'{out}'" in err and "notes.txt" in err and "not a preset" in err
    assert [path.name for path in out.iterdir()] == ["notes.txt"] and (out / "notes.txt").read_text() == "keep me"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["mine"]  # no staging directory left

    # A preset this command wrote is replaced, and a file the user added to it is kept.
    preset = tmp_path / "preset"
    assert run(capsys, "convert", tiny_bert_checkpoints["model"], "--class", "BertBackbone", "--out", preset,
               "--no-verify")[0] == 0
    (preset / "notes.txt").write_text("mine too")
    assert run(capsys, "convert", tiny_bert_checkpoints["model"], "--class", "BertBackbone", "--out", preset,
               "--no-verify")[0] == 0
    assert (preset / "notes.txt").read_text() == "mine too" and (preset / "config.json").is_file()


# ------------------------------------------------------------------ errors


def test_errors(tiny_bert_checkpoints, capsys, tmp_path):
    code, _, err = run(capsys, "convert", "bert_tinyy", "--out", tmp_path / "x")
    assert code == 2 and "Unknown preset 'bert_tinyy'" in err and "Did you mean: bert_tiny" in err

    code, _, err = run(capsys, "convert", tiny_bert_checkpoints["model"], "--out", tmp_path / "x")
    assert code == 2 and "not a named preset: pass --class" in err

    code, _, err = run(capsys, "convert", "hf://zoo-org/whatever", "--out", tmp_path / "x")
    assert code == 2 and "--class" in err

    code, _, err = run(capsys, "convert", tiny_bert_checkpoints["model"], "--class", "BertBackbon", "--out", tmp_path / "x")
    assert code == 2 and "BertBackbon" in err and "BertBackbone" in err

    code, _, err = run(capsys, "convert", str(tmp_path / "nowhere"), "--class", "BertBackbone", "--out", tmp_path / "x")
    assert code == 2 and "does not exist" in err

    code, _, err = run(capsys, "convert", "vilbert_multitask", "--out", tmp_path / "x")
    assert code == 2 and "not converted here" in err and "azk-convert vilbert" in err

    code, _, err = run(capsys, "convert", "bert_tiny", "--all", "--out", tmp_path / "x")
    assert code == 2 and "--all" in err

    code, _, err = run(capsys, "convert", "--out", tmp_path / "x")
    assert code == 2 and "--all" in err

    # A transformers checkpoint, an empty folder and a missing one are no native presets.
    for directory in (tiny_bert_checkpoints["model"], tmp_path, tmp_path / "nowhere"):
        code, _, err = run(capsys, "verify", directory, "--reference", tiny_bert_checkpoints["model"])
        assert code == 2 and ("native" in err or "not a directory" in err)
    code, _, err = run(capsys, "verify", tiny_bert_checkpoints["model"], "--reference", tiny_bert_checkpoints["model"])
    assert code == 2 and "not written by this library" in err

    assert run(capsys, "convert", tiny_bert_checkpoints["model"], "--class", "BertBackbone", "--out", tmp_path / "n",
               "--no-verify")[0] == 0
    code, _, err = run(capsys, "verify", tmp_path / "n", "--reference", "bert_tinyy")
    assert code == 2 and "--reference" in err and "Did you mean: bert_tiny" in err

    with pytest.raises(SystemExit) as exit_info:  # argparse: --reference is required
        cli.main(["verify", str(tmp_path / "n")])
    assert exit_info.value.code == 2 and "--reference" in capsys.readouterr().err


def test_a_download_failure_exits_1(local_hub, capsys, tmp_path):
    code, _, err = run(capsys, "convert", "hf://zoo-org/missing", "--class", "BertBackbone", "--out", tmp_path / "x")
    assert code == 1 and "repository not found" in err
    assert not (tmp_path / "x").exists()


# ------------------------------------------------------------------ publish


@pytest.fixture
def native_preset(tiny_bert_checkpoints, capsys, tmp_path):
    out = tmp_path / "native"
    assert run(capsys, "convert", tiny_bert_checkpoints["model"], "--class", "BertBackbone", "--out", out)[0] == 0
    return out


def test_publish_calls_upload_preset(native_preset, capsys, monkeypatch):
    calls = []
    monkeypatch.setattr(
        azk, "upload_preset",
        lambda handle, directory, **options: calls.append((handle, directory, options)) or types.SimpleNamespace(oid="c0ffee"),
    )
    code, stdout, _ = run(capsys, "publish", native_preset, "hf://zoo-org/tiny-bert", "--revision", "v1", "--private")
    assert code == 0 and "published" in stdout and "@v1 (commit c0ffee)" in stdout
    assert calls == [("hf://zoo-org/tiny-bert", str(native_preset), {"revision": "v1", "private": True})]

    calls.clear()
    assert run(capsys, "publish", native_preset, "hf://zoo-org/tiny-bert")[0] == 0
    assert calls[0][2] == {"revision": None, "private": False}


def test_publish_errors(native_preset, tiny_bert_checkpoints, capsys, monkeypatch):
    calls = []
    monkeypatch.setattr(
        azk, "upload_preset", lambda *args, **kwargs: calls.append(args) or types.SimpleNamespace(oid="c0ffee")
    )
    code, _, err = run(capsys, "publish", tiny_bert_checkpoints["model"], "hf://zoo-org/tiny-bert")
    assert code == 2 and "not a native" in err
    code, _, err = run(capsys, "publish", native_preset, "zoo-org/tiny-bert")
    assert code == 2 and "hf://org/name" in err
    perturb_a_kernel(native_preset)
    assert run(capsys, "verify", native_preset, "--reference", tiny_bert_checkpoints["model"])[0] == 1
    code, _, err = run(capsys, "publish", native_preset, "hf://zoo-org/tiny-bert")
    assert code == 2 and "failed its parity check" in err and "--allow-failed-parity" in err
    assert calls == []
    assert run(capsys, "publish", native_preset, "hf://zoo-org/tiny-bert", "--allow-failed-parity")[0] == 0
    assert len(calls) == 1


def test_publish_uploads_to_the_hub_and_loads_back(native_preset, capsys, tmp_path, monkeypatch):
    from tests.support.hub_server import serving

    with serving(tmp_path, monkeypatch, tokens={"hf_writer": {"zoo-org"}}):
        monkeypatch.setenv("HF_TOKEN", "hf_writer")
        code, stdout, err = run(capsys, "publish", native_preset, "hf://zoo-org/tiny-bert-native", "--revision", "v1")
        assert code == 0, err
        assert "published" in stdout
        loaded = azk.models.BertBackbone.from_preset("hf://zoo-org/tiny-bert-native@v1")
        card = azk.hub.PresetSource("hf://zoo-org/tiny-bert-native@v1").require("README.md").read_text()
        assert "## Parity" in card
    expected = azk.models.BertBackbone.from_preset(str(native_preset))
    for ours, theirs in zip(loaded.weights, expected.weights):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(ours), keras.ops.convert_to_numpy(theirs))


# ------------------------------------------------------- python -m conversion


# The command line's parsing, the same on every backend.
@pytest.mark.backend_independent
def test_help_lists_the_commands_and_a_missing_command_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--help"])
    assert exit_info.value.code == 0
    help_text = capsys.readouterr().out
    for command in ("list", "convert", "verify", "publish", "vilbert"):
        assert command in help_text
    with pytest.raises(SystemExit) as exit_info:
        cli.main([])
    assert exit_info.value.code == 2


# One subprocess (each imports Keras and the backends, several seconds): the
# checkout's `python -m conversion` runs this command line and exits with its
# code, its message on stderr. The same on every backend.
@pytest.mark.backend_independent
def test_python_dash_m_conversion(tmp_path):
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "conversion", "verify", str(tmp_path), "--reference", str(tmp_path)],
        cwd=ROOT, env=environment, capture_output=True, text=True,
    )
    assert done.returncode == 2 and "no config.json" in done.stderr
