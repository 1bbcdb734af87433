"""Converted GPT-2 checkpoints against `transformers` (tolerance: 1e-4 absolute,
fp32), tokenization, preset round trips and training."""

import json
import shutil

import keras
import numpy as np
import pytest
import torch
import transformers

from attention_zoo_keras.models.gpt import GPTBackbone
from attention_zoo_keras.models.gpt import GPTCausalLM
from attention_zoo_keras.models.gpt import GPTCausalLMPreprocessor
from attention_zoo_keras.models.gpt import GPTTokenizer
from tests.support.family_tests import run_backbone_test
from tests.support.family_tests import run_precision_test
from tests.support.family_tests import run_preset_test
from tests.support.family_tests import run_task_test
from tests.support.tiny_checkpoints import GPT2_CORPUS as CORPUS

ATOL = 1e-4

PROMPTS = [
    "the cat sat on the mat",
    "a man",
    "the new movie is awesome! the dog sat on the log",
    "Hello 🙂",
    "x",
]


def hf_batch(path, texts, max_length=16):
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "right"
    return tokenizer(texts, padding="max_length", max_length=max_length, truncation=True, return_tensors="pt")


def ours(encoded):
    return {
        "token_ids": encoded["input_ids"].numpy().astype("int32"),
        "padding_mask": encoded["attention_mask"].numpy().astype("int32"),
    }


def test_causal_lm_logits_on_a_right_padded_batch(tiny_gpt2_checkpoints):
    path = tiny_gpt2_checkpoints["lm"]
    reference = transformers.GPT2LMHeadModel.from_pretrained(path).eval()
    encoded = hf_batch(path, PROMPTS)
    assert len(set(encoded["attention_mask"].sum(-1).tolist())) > 2  # really different lengths
    with torch.no_grad():
        expected = reference(**encoded).logits.numpy()

    lm = GPTCausalLM.from_preset(str(path))
    logits = keras.ops.convert_to_numpy(lm(ours(encoded)))
    real = encoded["attention_mask"].numpy().astype(bool)
    np.testing.assert_allclose(logits[real], expected[real], atol=ATOL)

    # The preprocessor packs prompts exactly as transformers pads them.
    lm.preprocessor.add_end_token = False
    features = lm.preprocessor.pack(PROMPTS, sequence_length=16)
    np.testing.assert_array_equal(features["token_ids"], encoded["input_ids"].numpy())
    np.testing.assert_array_equal(features["padding_mask"], encoded["attention_mask"].numpy())


def test_backbone_sequence_output(tiny_gpt2_checkpoints):
    path = tiny_gpt2_checkpoints["model"]
    reference = transformers.GPT2Model.from_pretrained(path).eval()
    encoded = hf_batch(path, PROMPTS)
    with torch.no_grad():
        expected = reference(**encoded).last_hidden_state.numpy()
    backbone = GPTBackbone.from_preset(str(path))
    assert backbone.max_sequence_length == 32 and backbone.intermediate_dim == 128  # n_inner None
    output = keras.ops.convert_to_numpy(backbone(ours(encoded))["sequence_output"])
    real = encoded["attention_mask"].numpy().astype(bool)
    np.testing.assert_allclose(output[real], expected[real], atol=ATOL)


def test_backbone_from_lm_head_checkpoint(tiny_gpt2_checkpoints):
    """The `transformer.` prefix of `GPT2LMHeadModel` is handled."""
    path = tiny_gpt2_checkpoints["lm"]
    reference = transformers.GPT2LMHeadModel.from_pretrained(path).eval()
    encoded = hf_batch(path, PROMPTS[:2])
    with torch.no_grad():
        expected = reference.transformer(**encoded).last_hidden_state.numpy()
    output = keras.ops.convert_to_numpy(GPTBackbone.from_preset(str(path))(ours(encoded))["sequence_output"])
    real = encoded["attention_mask"].numpy().astype(bool)
    np.testing.assert_allclose(output[real], expected[real], atol=ATOL)


@pytest.mark.parametrize("files", ["tokenizer.json", "vocab.json+merges.txt"])
def test_token_ids_match_transformers(tiny_gpt2_checkpoints, tmp_path, files):
    path = tiny_gpt2_checkpoints["lm"]
    if files != "tokenizer.json":
        path = shutil.copytree(path, tmp_path / "checkpoint")
        (path / "tokenizer.json").unlink()
        for name in ("vocab.json", "merges.txt"):  # transformers 5 writes only tokenizer.json
            if not (path / name).exists():
                shutil.copy(tiny_gpt2_checkpoints["lm"].parent / name, path / name)
    hf_tokenizer = transformers.GPT2TokenizerFast.from_pretrained(tiny_gpt2_checkpoints["lm"])
    preprocessor = GPTCausalLMPreprocessor.from_preset(str(path))
    assert preprocessor.sequence_length == 32  # n_positions
    texts = CORPUS + ["unseen words: zebra xylophone", "<|endoftext|> between<|endoftext|>texts", ""]
    expected = [hf_tokenizer(text)["input_ids"] for text in texts]
    assert preprocessor.tokenizer.encode(texts) == expected
    assert preprocessor.tokenizer.end_token_id == hf_tokenizer.eos_token_id
    assert preprocessor.tokenizer.decode(expected[5]) == CORPUS[5]


def test_save_to_preset_round_trip(tiny_gpt2_checkpoints, tmp_path):
    lm = GPTCausalLM.from_preset(str(tiny_gpt2_checkpoints["lm"]))
    lm.preprocessor.sequence_length = 12
    x, _, _ = lm.preprocessor(PROMPTS)
    restored = run_preset_test(lm, str(tmp_path / "preset"), x)
    assert restored.preprocessor.sequence_length == 12 and restored.preprocessor.add_end_token
    np.testing.assert_array_equal(restored.predict(PROMPTS, verbose=0), lm.predict(PROMPTS, verbose=0))
    backbone = GPTBackbone.from_preset(str(tmp_path / "preset"))
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(backbone(x)["sequence_output"]),
        keras.ops.convert_to_numpy(lm.backbone(x)["sequence_output"]),
    )


def test_preprocessor_shifts_labels_and_weights_padding_zero(tiny_gpt2_checkpoints):
    tokenizer = GPTTokenizer.from_file(tiny_gpt2_checkpoints["lm"] / "tokenizer.json")
    end = tokenizer.end_token_id
    preprocessor = GPTCausalLMPreprocessor(tokenizer, sequence_length=10, add_start_token=True)
    texts = ["a man", "the cat sat on the mat the dog sat on the log"]
    x, y, w = preprocessor(texts)
    ids = tokenizer.encode(texts)
    full = [end] + ids[0] + [end]
    assert x["token_ids"][0, : len(full)].tolist() == full
    assert x["padding_mask"][0].tolist() == [1] * len(full) + [0] * (10 - len(full))
    assert y[0, : len(full) - 1].tolist() == full[1:]
    assert w[0].tolist() == [1.0] * (len(full) - 1) + [0.0] * (11 - len(full))
    assert np.all(x["token_ids"][0, len(full):] == end) and np.all(y[0, len(full) - 1:] == end)
    # A long text is truncated, keeping room for the start and end tokens.
    assert x["token_ids"][1, 0] == end and y[1, -1] == end and w[1].all()
    assert x["token_ids"][1, 1:].tolist() == ids[1][:9]
    with pytest.raises(ValueError, match="takes no labels"):
        preprocessor(texts, np.array([0, 1]))


def test_unsupported_variants_are_rejected(tiny_gpt2_checkpoints, tmp_path):
    path = shutil.copytree(tiny_gpt2_checkpoints["model"], tmp_path / "checkpoint")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "scale_attn_by_inverse_layer_idx": True}))
    with pytest.raises(ValueError, match="scale_attn_by_inverse_layer_idx"):
        GPTBackbone.from_preset(str(path))
    (path / "config.json").write_text(json.dumps({**config, "scale_attn_weights": False}))
    with pytest.raises(ValueError, match="scale_attn_weights"):
        GPTBackbone.from_preset(str(path))


def test_out_of_range_ids_and_lengths_raise(tiny_gpt2_checkpoints):
    backbone = GPTBackbone.from_preset(str(tiny_gpt2_checkpoints["model"]))
    ids = np.array([[1, backbone.vocabulary_size]], dtype="int32")
    with pytest.raises(ValueError, match="outside the valid range"):
        backbone({"token_ids": ids, "padding_mask": np.ones_like(ids)})
    ids = np.ones((1, 33), dtype="int32")
    with pytest.raises(ValueError, match="maximum sequence length"):
        backbone({"token_ids": ids, "padding_mask": np.ones_like(ids)})


TINY = dict(vocabulary_size=20, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16, max_sequence_length=8)
TINY_INPUTS = {"token_ids": np.array([[1, 2, 3, 0]], "int32"), "padding_mask": np.array([[1, 1, 1, 0]], "int32")}


def test_backbone_behaviour(tmp_path):
    longer = {"token_ids": np.ones((3, 8), "int32"), "padding_mask": np.ones((3, 8), "int32")}
    run_backbone_test(
        GPTBackbone, TINY, TINY_INPUTS, {"sequence_output": (1, 4, 8)}, tmp_path,
        variable_input_data=[(longer, {"sequence_output": (3, 8, 8)})],
    )


def test_dtype_policy_survives_the_round_trip(tmp_path):
    backbone = GPTBackbone(**TINY, dtype="bfloat16")
    assert {v.dtype for v in backbone.weights} == {"bfloat16"}
    run_preset_test(backbone, str(tmp_path), TINY_INPUTS)
    as_float32 = GPTBackbone.from_preset(str(tmp_path), dtype="float32")
    assert {v.dtype for v in as_float32.weights} == {"float32"}


def test_bfloat16_forward_pass():
    run_precision_test(GPTBackbone, TINY, TINY_INPUTS, policy="bfloat16")


@pytest.mark.slow
def test_fit_lowers_the_loss_with_padding_weighted_zero(tiny_gpt2_checkpoints):
    keras.utils.set_random_seed(0)
    tokenizer = GPTTokenizer.from_file(tiny_gpt2_checkpoints["lm"] / "tokenizer.json")
    backbone = GPTBackbone(
        vocabulary_size=tokenizer.vocabulary_size, num_layers=2, num_heads=2, hidden_dim=32,
        intermediate_dim=64, max_sequence_length=24, dropout=0.0, attention_dropout=0.0,
    )
    lm = GPTCausalLM(backbone=backbone, preprocessor=GPTCausalLMPreprocessor(tokenizer, sequence_length=24))
    texts = CORPUS[:5] * 8
    x, y, w = lm.preprocessor(texts[:5])
    assert np.all(w[x["padding_mask"] == 0] == 0) and (w == 0).any()
    lm.compile(optimizer=keras.optimizers.Adam(3e-3))
    before = lm.evaluate(texts, verbose=0, return_dict=True)["loss"]
    history = lm.fit(texts, batch_size=8, epochs=8, verbose=0)
    after = lm.evaluate(texts, verbose=0, return_dict=True)["loss"]
    assert after < 0.5 * before, (before, history.history["loss"], after)


def test_default_compile_is_applied_by_fit(tiny_gpt2_checkpoints):
    lm = GPTCausalLM.from_preset(str(tiny_gpt2_checkpoints["lm"]))
    lm.preprocessor.sequence_length = 8
    run_task_test(lm, CORPUS[:4], expected_output_shape=(4, 8, lm.backbone.vocabulary_size))
    assert isinstance(lm.optimizer, keras.optimizers.AdamW)
    assert isinstance(lm.loss, keras.losses.SparseCategoricalCrossentropy)


def test_linear_transformer_preset_is_gpt2_with_linear_attention(local_hub, tiny_gpt2_checkpoints):
    """`linear_transformer_gpt2` loads GPT-2's checkpoint (here a tiny one served
    as openai-community/gpt2) into a linear-attention backbone: the same weights,
    the outputs of linear attention, and generation with the recurrent state."""
    local_hub.add_repo("openai-community/gpt2", tiny_gpt2_checkpoints["lm"])
    linear_lm = GPTCausalLM.from_preset("linear_transformer_gpt2")
    softmax_lm = GPTCausalLM.from_preset(tiny_gpt2_checkpoints["lm"])
    backbone = linear_lm.backbone
    assert (backbone.attention, backbone.attention_dropout) == ("linear", 0.0)
    for ours, reference in zip(linear_lm.weights, softmax_lm.weights):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(ours), keras.ops.convert_to_numpy(reference))

    reference = GPTBackbone(**{**softmax_lm.backbone.get_config(), "attention": "linear", "attention_dropout": 0.0})
    reference.set_weights(softmax_lm.backbone.get_weights())
    token_ids = np.random.default_rng(0).integers(0, backbone.vocabulary_size, (2, 12)).astype("int32")
    features = {"token_ids": token_ids, "padding_mask": np.ones_like(token_ids)}
    linear_hidden = keras.ops.convert_to_numpy(backbone(features)["sequence_output"])
    np.testing.assert_allclose(linear_hidden, keras.ops.convert_to_numpy(reference(features)["sequence_output"]),
                               atol=1e-5)
    softmax_hidden = keras.ops.convert_to_numpy(softmax_lm.backbone(features)["sequence_output"])
    assert np.abs(linear_hidden - softmax_hidden).max() > 1e-2  # a different function until fine-tuned

    assert not linear_lm.decoding.position_addressed  # the recurrent state
    assert linear_lm.generate("the cat", max_new_tokens=4, stop_token_ids=None).startswith("the cat")
