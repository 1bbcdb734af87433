"""Converted BERT checkpoints against `transformers` (tolerance: 1e-4 absolute, fp32)."""

import keras
import numpy as np
import torch
import transformers

import attention_zoo_keras as azk

ATOL = 1e-4

SENTENCES = [
    "the film was very good",
    "the plot was not good, but the acting was great!",
    "a cat sat on the mat",
    "the dog is eating food",
    "awful",
    "this movie is long and boring . the story is dull",
    "wonderful music and an excellent story",
    "zebras? xylophones!",
]


def hf_inputs(checkpoint_dir, texts, pairs=None):
    tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint_dir)
    return tokenizer(texts, pairs, padding="max_length", max_length=24, truncation=True, return_tensors="pt")


def our_inputs(encoded):
    return {
        "token_ids": encoded["input_ids"].numpy().astype("int32"),
        "segment_ids": encoded["token_type_ids"].numpy().astype("int32"),
        "padding_mask": encoded["attention_mask"].numpy().astype("int32"),
    }


def test_masked_lm_hidden_states_and_logits(tiny_bert_checkpoints):
    path = tiny_bert_checkpoints["masked_lm"]
    reference = transformers.BertForMaskedLM.from_pretrained(path).eval()
    encoded = hf_inputs(path, SENTENCES)
    with torch.no_grad():
        expected = reference(**encoded, output_hidden_states=True)

    model = azk.models.BertMaskedLM.from_preset(str(path))
    inputs = our_inputs(encoded)
    batch, length = inputs["token_ids"].shape
    inputs["mask_positions"] = np.tile(np.arange(length, dtype="int32"), (batch, 1))
    logits = keras.ops.convert_to_numpy(model(inputs))
    np.testing.assert_allclose(logits, expected.logits.numpy(), atol=ATOL)

    sequence = keras.ops.convert_to_numpy(model.backbone(our_inputs(encoded))["sequence_output"])
    np.testing.assert_allclose(sequence, expected.hidden_states[-1].numpy(), atol=ATOL)


def test_backbone_sequence_and_pooled_output(tiny_bert_checkpoints):
    path = tiny_bert_checkpoints["model"]
    reference = transformers.BertModel.from_pretrained(path).eval()
    encoded = hf_inputs(path, SENTENCES[:4], SENTENCES[4:])
    with torch.no_grad():
        expected = reference(**encoded)
    outputs = azk.models.BertBackbone.from_preset(str(path))(our_inputs(encoded))
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(outputs["sequence_output"]), expected.last_hidden_state.numpy(), atol=ATOL
    )
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(outputs["pooled_output"]), expected.pooler_output.numpy(), atol=ATOL
    )


def test_sequence_classification_logits_from_raw_text(tiny_bert_checkpoints):
    path = tiny_bert_checkpoints["classifier"]
    reference = transformers.BertForSequenceClassification.from_pretrained(path).eval()
    encoded = hf_inputs(path, SENTENCES)
    with torch.no_grad():
        expected = reference(**encoded).logits.numpy()

    classifier = azk.models.BertTextClassifier.from_preset(str(path))
    assert classifier.num_classes == 3  # taken from the checkpoint
    classifier.preprocessor.sequence_length = 24
    np.testing.assert_allclose(classifier.predict(SENTENCES, verbose=0), expected, atol=ATOL)


def test_pair_tokenization_and_truncation_match_transformers(tiny_bert_checkpoints):
    path = tiny_bert_checkpoints["model"]
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    preprocessor = azk.models.BertPreprocessor.from_preset(str(path), sequence_length=12)
    firsts = ["the film was very good and the acting great", "a cat", "the plot was long", "dull"]
    seconds = ["a dog sat on the mat", "the story of a man riding a horse to the music", "boring", "zebras"]
    ours = preprocessor((firsts, seconds))
    theirs = hf_tokenizer(firsts, seconds, padding="max_length", max_length=12, truncation="longest_first")
    np.testing.assert_array_equal(ours["token_ids"], theirs["input_ids"])
    np.testing.assert_array_equal(ours["segment_ids"], theirs["token_type_ids"])
    np.testing.assert_array_equal(ours["padding_mask"], theirs["attention_mask"])


def test_real_minilm_sentence_embeddings_and_token_ids(minilm_dir):
    sentences = [
        "A man is eating food.",
        "A man is eating a piece of bread.",
        "The girl is carrying a baby.",
        "A man is riding a horse.",
        "A woman is playing violin.",
        "Two men pushed carts through the woods.",
        "A man is riding a white horse on an enclosed ground.",
        "A monkey is playing drums.",
        "Someone in a gorilla costume is playing a set of drums.",
        "A cheetah is running behind its prey.",
        "The new movie is awesome!",
        "The cat sits outside.",
        "A man is playing guitar.",
        "I love pasta.",
        "The new movie is so great!",
        "The cat plays in the garden.",
        "A woman watches TV.",
        "Do you like pizza?",
        "Héllo wörld — naïve café, 東京 and emojis 🙂 are tokenised too.",
        "Transformers process sequences with self-attention instead of recurrence.",
        "   leading and trailing spaces   ",
        "UPPER CASE TEXT IS LOWER-CASED BY AN UNCASED MODEL",
    ]
    tokenizer = transformers.AutoTokenizer.from_pretrained(minilm_dir)
    reference = transformers.AutoModel.from_pretrained(minilm_dir).eval()
    encoded = tokenizer(sentences, padding="max_length", max_length=64, truncation=True, return_tensors="pt")
    with torch.no_grad():
        hidden = reference(**encoded).last_hidden_state
    mask = encoded["attention_mask"][..., None].float()
    mean_pooled = ((hidden * mask).sum(1) / mask.sum(1)).numpy()

    preprocessor = azk.models.BertPreprocessor.from_preset(str(minilm_dir), sequence_length=64)
    features = preprocessor(sentences)
    width = features["token_ids"].shape[1]  # the batch's bucket length: padding beyond it is dropped
    np.testing.assert_array_equal(features["token_ids"], encoded["input_ids"].numpy()[:, :width])
    assert not encoded["attention_mask"].numpy()[:, width:].any()

    embedder = azk.models.BertTextEmbedder.from_preset(str(minilm_dir), preprocessor=preprocessor, normalize=False)
    np.testing.assert_allclose(embedder.predict(sentences, verbose=0), mean_pooled, atol=ATOL)

    normalized = azk.models.BertTextEmbedder.from_preset(str(minilm_dir), preprocessor=preprocessor)
    assert normalized.pooling == "mean" and normalized.normalize  # read from modules.json
    expected = mean_pooled / np.linalg.norm(mean_pooled, axis=-1, keepdims=True)
    np.testing.assert_allclose(normalized.predict(sentences, verbose=0), expected, atol=ATOL)


def test_sharded_transformers_checkpoint(tiny_bert_checkpoints, tmp_path):
    """`save_pretrained(max_shard_size=...)` writes shards and an index; they
    load to the same model as the single file."""
    reference = transformers.BertForSequenceClassification.from_pretrained(tiny_bert_checkpoints["classifier"])
    reference.save_pretrained(tmp_path, max_shard_size="30KB")
    transformers.AutoTokenizer.from_pretrained(tiny_bert_checkpoints["classifier"]).save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors.index.json").exists() and not (tmp_path / "model.safetensors").exists()
    sharded = azk.models.BertTextClassifier.from_preset(str(tmp_path))
    single = azk.models.BertTextClassifier.from_preset(str(tiny_bert_checkpoints["classifier"]))
    np.testing.assert_array_equal(sharded.predict(SENTENCES, verbose=0), single.predict(SENTENCES, verbose=0))


def test_bfloat16_transformers_checkpoint(tiny_bert_checkpoints, tmp_path):
    """bfloat16 safetensors (which numpy cannot read natively) load exactly:
    our float32 model equals transformers' bf16 weights upcast to float32."""
    model = transformers.BertModel.from_pretrained(tiny_bert_checkpoints["model"]).to(torch.bfloat16)
    model.save_pretrained(tmp_path)
    transformers.AutoTokenizer.from_pretrained(tiny_bert_checkpoints["model"]).save_pretrained(tmp_path)
    reference = model.float().eval()
    encoded = hf_inputs(tmp_path, SENTENCES)
    with torch.no_grad():
        expected = reference(**encoded).last_hidden_state.numpy()
    ours = azk.models.BertBackbone.from_preset(str(tmp_path))(our_inputs(encoded))["sequence_output"]
    np.testing.assert_allclose(keras.ops.convert_to_numpy(ours), expected, atol=ATOL)
