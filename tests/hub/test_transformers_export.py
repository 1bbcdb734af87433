"""`export_to_transformers`: checkpoints written by `transformers` are loaded,
fine-tuned here, exported, and loaded back by `transformers`, which must
compute what this library computes (fp32: 1e-4 on logits, the same greedy
tokens); the export also loads back into this library. Runs on every
backend (the reference side is always PyTorch)."""

import json
from pathlib import Path

import keras
import numpy as np
import pytest

import attention_zoo_keras as azk
from attention_zoo_keras.hub.converters import NotExportableError
from attention_zoo_keras.hub.transformers_export import probe_checkpoint
from attention_zoo_keras.hub.transformers_export import transformers_arrays
from tests.support.reformer_sentencepiece import CORPUS
from tests.support.reformer_sentencepiece import train_sentencepiece

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TOLERANCE = 1e-4
TRANSFO_XL_FIXTURE = Path(__file__).parents[1] / "fixtures" / "transfo_xl"
BERT_TEXTS = ["the cat sat on the mat", "a dog"]


def _numpy(x):
    return keras.ops.convert_to_numpy(x)


def _fine_tune(task, inputs, labels):
    """One optimizer step, so that the export is not the checkpoint it came from."""
    task.compile(optimizer=keras.optimizers.SGD(0.5))
    before = [np.array(w) for w in task.get_weights()]
    task.fit(inputs, labels, batch_size=len(inputs), epochs=1, verbose=0)
    assert any(not np.array_equal(a, b) for a, b in zip(before, task.get_weights()))


def test_bert_classifier_round_trip(tiny_bert_checkpoints, tmp_path):
    classifier = azk.models.BertTextClassifier.from_preset(str(tiny_bert_checkpoints["classifier"]))
    _fine_tune(classifier, BERT_TEXTS, np.array([0, 2]))
    classifier.export_to_transformers(tmp_path / "export")

    reference = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "export").eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "export")
    ours = _numpy(classifier.preprocessor(BERT_TEXTS)["token_ids"])
    batch = tokenizer(BERT_TEXTS, padding="max_length", max_length=ours.shape[1], return_tensors="pt")
    np.testing.assert_array_equal(batch["input_ids"].numpy(), ours)
    assert tokenizer.model_max_length == classifier.preprocessor.sequence_length
    with torch.no_grad():
        theirs = reference(**batch).logits.numpy()
    logits = _numpy(classifier.predict(BERT_TEXTS, verbose=0))
    np.testing.assert_allclose(theirs, logits, atol=TOLERANCE)

    reloaded = azk.models.BertTextClassifier.from_preset(str(tmp_path / "export"))
    np.testing.assert_allclose(_numpy(reloaded.predict(BERT_TEXTS, verbose=0)), logits, atol=TOLERANCE)


def test_bert_masked_lm_drops_the_unused_pooler(tiny_bert_checkpoints, tmp_path):
    backbone = azk.models.BertBackbone.from_preset(str(tiny_bert_checkpoints["model"]))
    masked_lm = azk.models.BertMaskedLM(backbone)
    with pytest.warns(UserWarning, match="pooler"):
        masked_lm.export_to_transformers(tmp_path)
    reference = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path).eval()
    token_ids = np.array([[2, 5, 6, 7, 3], [2, 8, 3, 0, 0]])
    padding_mask = (token_ids != 0).astype("int32")
    positions = np.array([[1, 2], [1, 2]])
    ours = masked_lm({
        "token_ids": token_ids, "segment_ids": np.zeros_like(token_ids),
        "padding_mask": padding_mask, "mask_positions": positions,
    })
    with torch.no_grad():
        theirs = reference(input_ids=torch.tensor(token_ids), attention_mask=torch.tensor(padding_mask)).logits
    np.testing.assert_allclose(theirs.numpy()[np.arange(2)[:, None], positions], _numpy(ours), atol=TOLERANCE)


def test_gpt2_causal_lm_generates_the_same_tokens(tiny_gpt2_checkpoints, tmp_path):
    lm = azk.models.GPTCausalLM.from_preset(str(tiny_gpt2_checkpoints["lm"]))
    _fine_tune(lm, ["the cat sat on the mat"], None)
    lm.export_to_transformers(tmp_path)

    reference = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path)
    text = "Hello world, naïve café"
    prompt = lm.preprocessor.tokenizer.encode([text])[0]
    assert tokenizer(text)["input_ids"] == prompt
    ours = lm.generate(
        {"token_ids": np.array([prompt]), "padding_mask": np.ones((1, len(prompt)), "int32")},
        max_new_tokens=8, stop_token_ids=None,
    )
    with torch.no_grad():
        theirs = reference.generate(
            torch.tensor([prompt]), max_new_tokens=8, do_sample=False, eos_token_id=None,
            pad_token_id=tokenizer.eos_token_id,
        )
    np.testing.assert_array_equal(ours["token_ids"][0, : len(prompt) + 8], theirs[0].numpy())
    with torch.no_grad():
        logits = reference(torch.tensor([prompt])).logits.numpy()
    np.testing.assert_allclose(
        logits, _numpy(lm({"token_ids": np.array([prompt]), "padding_mask": np.ones((1, len(prompt)))})),
        atol=TOLERANCE,
    )


def test_vit_classifier_with_its_image_processor(tiny_vit_checkpoints, tmp_path):
    classifier = azk.models.ViTImageClassifier.from_preset(str(tiny_vit_checkpoints["classifier"]))
    images = np.random.RandomState(0).randint(0, 256, (2, 40, 36, 3)).astype("uint8")
    _fine_tune(classifier, images, np.array([0, 1]))
    classifier.export_to_transformers(tmp_path)

    reference = transformers.AutoModelForImageClassification.from_pretrained(tmp_path).eval()
    processor = transformers.AutoImageProcessor.from_pretrained(tmp_path)
    assert reference.config.id2label == {0: "cat", 1: "dog", 2: "bird"}
    with torch.no_grad():
        theirs = reference(**processor(list(images), return_tensors="pt")).logits.numpy()
    np.testing.assert_allclose(theirs, _numpy(classifier.predict(images, verbose=0)), atol=TOLERANCE)


def test_marian_round_trip_with_its_tokenizer(tiny_marian_checkpoint, tmp_path):
    translator = azk.models.TransformerSeq2SeqLM.from_preset(str(tiny_marian_checkpoint))
    translator.save_to_preset(tmp_path / "preset")  # the SentencePiece models travel with the preset
    translator = azk.models.TransformerSeq2SeqLM.from_preset(str(tmp_path / "preset"))
    translator.export_to_transformers(tmp_path / "export")

    original = transformers.MarianMTModel.from_pretrained(tiny_marian_checkpoint).state_dict()
    reference = transformers.MarianMTModel.from_pretrained(tmp_path / "export").eval()
    exported = reference.state_dict()
    assert set(exported) == set(original)
    for name, tensor in original.items():
        np.testing.assert_array_equal(exported[name].numpy(), tensor.numpy(), err_msg=name)

    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "export")
    texts = ["the cat sat", "a dog ran home"]
    assert [ids[:-1] for ids in tokenizer(texts)["input_ids"]] == translator.preprocessor.tokenizer.encode(texts)
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    with torch.no_grad():
        theirs = reference.generate(**batch, max_new_tokens=6, do_sample=False, num_beams=1).numpy()
    ours = translator.generate(translator.preprocessor.pack_sources(texts), max_new_tokens=6)["token_ids"]
    np.testing.assert_array_equal(ours, theirs)
    assert [translator.preprocessor.tokenizer.decode(row) for row in ours] == tokenizer.batch_decode(
        theirs, skip_special_tokens=True
    )


def test_a_character_tokenizer_is_not_a_marian_tokenizer(tmp_path):
    tokenizer = azk.models.TransformerTokenizer.from_characters("abc")
    backbone = azk.models.TransformerBackbone(
        vocabulary_size=tokenizer.vocabulary_size, num_encoder_layers=1, num_decoder_layers=1, num_heads=2,
        hidden_dim=8, intermediate_dim=16, activation="gelu", position_embedding="sinusoidal_concatenated",
        scale_embeddings=False, final_norm=False,
    )
    translator = azk.models.TransformerSeq2SeqLM(
        backbone, logits_bias=True, preprocessor=azk.models.TransformerSeq2SeqLMPreprocessor(tokenizer)
    )
    with pytest.raises(NotExportableError, match="SentencePiece.*include_preprocessor=False"):
        translator.export_to_transformers(tmp_path / "export")
    assert not (tmp_path / "export").exists()
    translator.export_to_transformers(tmp_path / "export", include_preprocessor=False)
    assert transformers.AutoConfig.from_pretrained(tmp_path / "export").pad_token_id == tokenizer.pad_token_id


def test_transformer_xl_gets_the_transformers_4_layout_back(tmp_path):
    """transformers 5 has no Transformer-XL: the export must reproduce the
    checkpoint transformers 4.37.2 saved (tied tensors once), tensor for tensor."""
    from safetensors.numpy import load_file

    lm = azk.models.TransformerXLCausalLM.from_preset(str(TRANSFO_XL_FIXTURE), preprocessor=None)
    lm.export_to_transformers(tmp_path)
    original = load_file(TRANSFO_XL_FIXTURE / "model.safetensors")
    exported = load_file(tmp_path / "model.safetensors")
    # The sinusoid's inverse frequencies are a buffer transformers computes.
    assert set(original) - set(exported) == {"transformer.pos_emb.inv_freq"}
    assert set(exported) <= set(original)
    for key in exported:
        np.testing.assert_array_equal(exported[key], original[key], err_msg=key)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["TransfoXLLMHeadModel"] and config["tie_projs"] == [False, True, True, True]


REFORMER = dict(
    vocab_size=40, hidden_size=8, num_attention_heads=2, attention_head_size=4, feed_forward_size=16,
    num_hashes=2, num_buckets=[2, 2], lsh_attn_chunk_length=4, lsh_num_chunks_before=1, local_attn_chunk_length=4,
    local_num_chunks_before=1, axial_pos_shape=[4, 8], axial_pos_embds_dim=[4, 4], max_position_embeddings=32,
    hidden_dropout_prob=0.0, lsh_attention_probs_dropout_prob=0.0, local_attention_probs_dropout_prob=0.0,
    pad_token_id=0, initializer_range=0.2,
)


def _perturbed(model):
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.1 * torch.randn(parameter.shape, generator=generator))
    return model


def test_reformer_classifier_weights_and_settings_come_back(tmp_path):
    config = transformers.ReformerConfig(
        **REFORMER, attn_layers=["local", "lsh"], is_decoder=False, lsh_num_chunks_after=1, num_labels=3
    )
    torch.manual_seed(0)
    _perturbed(transformers.ReformerForSequenceClassification(config)).save_pretrained(tmp_path / "original")
    classifier = azk.models.ReformerTextClassifier.from_preset(str(tmp_path / "original"), preprocessor=None)
    classifier.export_to_transformers(tmp_path / "export")

    original = transformers.ReformerForSequenceClassification.from_pretrained(tmp_path / "original")
    exported = transformers.ReformerForSequenceClassification.from_pretrained(tmp_path / "export")
    assert set(exported.state_dict()) == set(original.state_dict())
    for name, tensor in original.state_dict().items():
        np.testing.assert_array_equal(exported.state_dict()[name].numpy(), tensor.numpy(), err_msg=name)
    for key, value in REFORMER.items():
        assert json.loads(json.dumps(getattr(exported.config, key))) == value, key
    assert exported.config.attn_layers == ["local", "lsh"] and exported.config.num_labels == 3


def test_reformer_causal_lm_logits_match(tmp_path):
    backbone = azk.models.ReformerBackbone(
        vocabulary_size=40, hidden_dim=8, num_heads=2, head_dim=4, intermediate_dim=16, attention="local",
        num_layers=2, attention_options={"local": {"block_size": 4}}, axial_pos_shape=(4, 8),
        axial_pos_embds_dim=(4, 4), max_sequence_length=32, dropout=0.0, attention_dropout=0.0,
    )
    lm = azk.models.ReformerCausalLM(backbone)
    lm.export_to_transformers(tmp_path)
    reference = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    token_ids = np.random.RandomState(0).randint(1, 40, (2, 32))
    with torch.no_grad():
        theirs = reference(torch.tensor(token_ids)).logits.numpy()
    ours = lm({"token_ids": token_ids, "padding_mask": np.ones_like(token_ids)})
    np.testing.assert_allclose(theirs, _numpy(ours), atol=TOLERANCE)


def test_reformer_tokenizer_is_exported_and_encodes_alike_in_transformers(tmp_path):
    """A SentencePiece Reformer tokenizer comes out as `tokenizer.json`,
    which `transformers.AutoTokenizer` loads as its `ReformerTokenizer`
    and encodes and decodes as ours (and as `transformers` does from the
    `spiece.model`); enwik8's byte tokenizer has no `transformers` form and
    is refused by name."""
    spiece_model = train_sentencepiece(tmp_path / "spiece", "bpe")
    tokenizer = azk.models.ReformerTokenizer.from_sentencepiece(spiece_model)
    backbone = azk.models.ReformerBackbone(
        vocabulary_size=tokenizer.vocabulary_size, hidden_dim=8, num_heads=2, head_dim=4, intermediate_dim=16,
        attention="local", num_layers=1, attention_options={"local": {"block_size": 4}}, max_sequence_length=32,
        axial_pos_shape=None,
    )
    preprocessor = azk.models.ReformerCausalLMPreprocessor(tokenizer, sequence_length=32)
    azk.models.ReformerCausalLM(backbone, preprocessor=preprocessor).export_to_transformers(tmp_path / "export")

    exported = transformers.AutoTokenizer.from_pretrained(tmp_path / "export")
    original = transformers.ReformerTokenizer.from_pretrained(spiece_model.parent)
    texts = [text for text in CORPUS if text == text.rstrip()][:40] + ["unknown жж here"]
    ids = tokenizer.encode(texts)
    assert [exported(text, add_special_tokens=False)["input_ids"] for text in texts] == ids
    assert [original(text, add_special_tokens=False)["input_ids"] for text in texts] == ids
    assert (exported.eos_token_id, exported.unk_token_id) == (tokenizer.end_token_id, tokenizer.unknown_token_id)
    assert [exported.decode(row) for row in ids[:5]] == [tokenizer.decode(row) for row in ids[:5]]

    byte_lm = azk.models.ReformerCausalLM(
        backbone, preprocessor=azk.models.ReformerCausalLMPreprocessor(azk.models.ReformerByteTokenizer(), 32)
    )
    with pytest.raises(NotExportableError, match="include_preprocessor=False"):
        byte_lm.export_to_transformers(tmp_path / "bytes")
    assert not (tmp_path / "bytes").exists()


@pytest.mark.parametrize("div_val", [1, 2])
def test_transformer_xl_exports_load_back(tmp_path, div_val):
    """Both adaptive layouts, projected (`embedding_dim != hidden_dim`):
    one table over the vocabulary with a softmax projection per cluster
    (`div_val` 1), or a table per cluster; untied tables and projections."""
    backbone = azk.models.TransformerXLBackbone(
        vocabulary_size=30, num_layers=1, num_heads=2, hidden_dim=8, head_dim=4, intermediate_dim=16, mem_len=4,
        embedding_dim=12, cutoffs=[10, 20], div_val=div_val, dropout=0.0,
    )
    lm = azk.models.TransformerXLCausalLM(backbone, tie_embeddings=False)
    lm.export_to_transformers(tmp_path)
    reloaded = azk.models.TransformerXLCausalLM.from_preset(str(tmp_path), preprocessor=None)
    for ours, back in zip(lm.get_weights(), reloaded.get_weights(), strict=True):
        np.testing.assert_array_equal(back, ours)
    token_ids = np.random.RandomState(0).randint(0, 30, (2, 5))
    expected = _numpy(lm.score(token_ids)["log_probabilities"])
    # (the same weights; torch's CPU kernels may sum in another order for another tensor's memory layout)
    np.testing.assert_allclose(_numpy(reloaded.score(token_ids)["log_probabilities"]), expected, atol=1e-6, rtol=0)


def test_lora_updates_are_merged_into_the_export(tmp_path):
    backbone = azk.models.GPTBackbone(
        vocabulary_size=40, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16, max_sequence_length=16
    )
    backbone.enable_lora(rank=2)
    for variable in backbone.trainable_weights:  # LoRA's B starts at zero: make the update count
        variable.assign(np.random.RandomState(1).normal(size=variable.shape).astype("float32"))
    backbone.export_to_transformers(tmp_path)
    token_ids = np.array([[3, 1, 4, 1, 5]])
    ours = backbone({"token_ids": token_ids, "padding_mask": np.ones_like(token_ids)})["sequence_output"]
    with torch.no_grad():
        theirs = transformers.AutoModel.from_pretrained(tmp_path)(torch.tensor(token_ids)).last_hidden_state
    np.testing.assert_allclose(theirs.numpy(), _numpy(ours), atol=TOLERANCE)


def test_a_setting_transformers_lacks_is_refused_by_name(tmp_path):
    backbone = azk.models.BertBackbone(
        vocabulary_size=30, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16, attention="linear"
    )
    with pytest.raises(NotExportableError, match="attention='linear'"):
        backbone.export_to_transformers(tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_quantized_model_is_refused_with_what_to_do_instead(tmp_path):
    backbone = azk.models.BertBackbone(vocabulary_size=30, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16)
    classifier = azk.models.BertTextClassifier(backbone, num_classes=2)
    classifier.quantize("int8")
    with pytest.raises(NotExportableError, match=r"BertTextClassifier is quantized .*export before quantize\(\)"):
        classifier.export_to_transformers(tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_task_without_a_counterpart_is_refused(tmp_path):
    backbone = azk.models.BertBackbone(vocabulary_size=30, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16)
    with pytest.raises(NotExportableError, match="BertTextEmbedder has no transformers counterpart.*BertMaskedLM"):
        azk.models.BertTextEmbedder(backbone).export_to_transformers(tmp_path)


def test_existing_files_survive_a_failed_or_refused_export(tmp_path):
    backbone = azk.models.BertBackbone(vocabulary_size=30, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16)
    backbone.export_to_transformers(tmp_path / "export")
    (tmp_path / "export" / "README.md").write_text("my notes")
    before = {p.name: p.read_bytes() for p in (tmp_path / "export").iterdir()}
    linear = azk.models.BertBackbone(
        vocabulary_size=30, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16, attention="linear"
    )
    with pytest.raises(NotExportableError):
        linear.export_to_transformers(tmp_path / "export")
    assert {p.name: p.read_bytes() for p in (tmp_path / "export").iterdir()} == before

    backbone.export_to_transformers(tmp_path / "export")  # a re-export keeps the user's file
    assert (tmp_path / "export" / "README.md").read_text() == "my notes"

    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.json").write_text(json.dumps({"not": "transformers"}))
    with pytest.raises(Exception, match=r"other'.*is not an earlier transformers export"):
        backbone.export_to_transformers(tmp_path / "other")
    assert json.loads((tmp_path / "other" / "config.json").read_text()) == {"not": "transformers"}

    backbone.save_to_preset(tmp_path / "preset")  # this library's own preset is not an export either
    with pytest.raises(Exception, match=r"preset'.*is not an earlier transformers export"):
        backbone.export_to_transformers(tmp_path / "preset")


class _FakeConverter:
    """A converter mapping a two-tensor checkpoint, for the probe's own checks."""

    model_type = "fake"
    ignored_source_keys = ()
    optional_keys = frozenset()

    def __init__(self, weights):
        self.weights = weights


def _export(weights, arrays):
    checkpoint = probe_checkpoint({"a.weight": (2, 3), "b.weight": (3,)})
    return transformers_arrays(
        _FakeConverter(weights), {"architectures": ["Fake"]}, checkpoint, arrays, "the model"
    )


def test_the_probe_inverts_transposes_splits_and_ties():
    def weights(hf_config, checkpoint):
        first, second = np.split(checkpoint["a.weight"].T, [1], axis=1)
        return {"x": first, "y": second, "z": checkpoint["b.weight"], "tied": checkpoint["b.weight"]}

    a = np.arange(6, dtype="float32").reshape(2, 3) + 10
    b = np.array([1.0, 2.0, 3.0], "float32")
    exported = _export(weights, {"x": a.T[:, :1], "y": a.T[:, 1:], "z": b, "tied": b})
    np.testing.assert_array_equal(exported["a.weight"], a)
    np.testing.assert_array_equal(exported["b.weight"], b)

    with pytest.raises(NotExportableError, match="'tied' of the model and another weight"):
        _export(weights, {"x": a.T[:, :1], "y": a.T[:, 1:], "z": b, "tied": b + 1})
    with pytest.raises(NotExportableError, match="'x' of the model has the shape"):
        _export(weights, {"x": a, "y": a.T[:, 1:], "z": b, "tied": b})
    with pytest.raises(NotExportableError, match="no place in transformers' Fake: w"):
        _export(weights, {"x": a.T[:, :1], "y": a.T[:, 1:], "z": b, "tied": b, "w": b})


def test_the_probe_refuses_computed_weights_and_partial_tensors():
    def scaled(hf_config, checkpoint):
        return {"a": checkpoint["a.weight"] * 0.5, "b": checkpoint["b.weight"]}

    with pytest.raises(NotExportableError, match="computes 'a'"):
        _export(scaled, {"a": np.zeros((2, 3), "float32"), "b": np.zeros(3, "float32")})

    def partial(hf_config, checkpoint):
        return {"a": checkpoint["a.weight"][:1], "b": checkpoint["b.weight"]}

    with pytest.raises(NotExportableError, match="Only part of transformers' 'a.weight'"):
        _export(partial, {"a": np.zeros((1, 3), "float32"), "b": np.zeros(3, "float32")})

    def made_up(hf_config, checkpoint):
        return {"a": checkpoint["a.weight"], "b": checkpoint["b.weight"], "bias": np.zeros(2, np.int32)}

    arrays = {"a": np.zeros((2, 3), "float32"), "b": np.zeros(3, "float32")}
    _export(made_up, {**arrays, "bias": np.zeros(2, "float32")})
    with pytest.raises(NotExportableError, match="'bias' of the model is not zero"):
        _export(made_up, {**arrays, "bias": np.ones(2, "float32")})


def test_a_gpt_backbone_without_a_tokenizer_names_no_special_token_outside_its_vocabulary(tmp_path):
    """transformers' GPT-2 default `bos_token_id` / `eos_token_id` is 50256,
    outside a smaller vocabulary; without a tokenizer none is named."""
    import transformers

    backbone = azk.models.GPTBackbone(vocabulary_size=30, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16,
                                      max_sequence_length=16)
    backbone.export_to_transformers(tmp_path / "out")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config.get("bos_token_id") is None and config.get("eos_token_id") is None
    reference = transformers.GPT2Model.from_pretrained(tmp_path / "out")
    assert reference.config.eos_token_id is None and reference.config.vocab_size == 30
