"""Raw text through the preprocessors: every batch is padded to the bucket
length of its longest text (not always to `sequence_length`), labels follow
that width, the models give the same outputs as with max-length padding,
and a compiled `fit` traces once per bucket; raw input that is not text
gets the library's error, naming where in the data it is."""

import keras
import numpy as np
import pytest

import attention_zoo_keras as azk
from attention_zoo_keras.models.preprocessed_batches import PreprocessedBatches

VOCABULARY = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "great", "film", "the", "plot", "was", "dull"]
WORDS = VOCABULARY[5:]


def bert_tokenizer():
    return azk.models.BertTokenizer.from_vocabulary(VOCABULARY)


def text(num_words, offset=0):
    """A text of `num_words` vocabulary words (one token each)."""
    return " ".join(WORDS[(offset + index) % len(WORDS)] for index in range(num_words))


def gpt_tokenizer():
    vocabulary = {"<|endoftext|>": 0, "a": 1, "b": 2, "Ġ": 3, "ab": 4, "Ġab": 5}
    return azk.models.GPTTokenizer.from_vocabulary(vocabulary, [("a", "b"), ("Ġ", "ab")])


def tiny_bert(max_sequence_length=40):
    return azk.models.BertBackbone(
        vocabulary_size=len(VOCABULARY), num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16,
        max_sequence_length=max_sequence_length, dropout=0.0, attention_dropout=0.0,
    )


def character_seq2seq(length):
    """A tiny seq2seq model on the characters a, b, c, `length` positions long."""
    return azk.models.TransformerSeq2SeqLM(azk.models.TransformerBackbone(
        vocabulary_size=8, num_encoder_layers=1, num_decoder_layers=1, num_heads=2, hidden_dim=8,
        intermediate_dim=16, max_sequence_length=length,
    ), preprocessor=azk.models.TransformerSeq2SeqLMPreprocessor(
        azk.models.TransformerTokenizer.from_characters("abc"), encoder_sequence_length=length,
        decoder_sequence_length=length))


# --- widths --------------------------------------------------------------------


def test_bert_batches_pad_to_the_bucket_of_their_longest_text():
    bucketed = azk.models.BertPreprocessor(bert_tokenizer(), sequence_length=40, padding="buckets")
    fixed = azk.models.BertPreprocessor(bert_tokenizer(), sequence_length=40, padding="max_length")
    # [CLS] + words + [SEP]: 14 tokens fit 16, 15 + 2 = 17 needs 32, 60 + 2 is truncated to 40.
    for words, width in ((3, 16), (14, 16), (15, 32), (30, 32), (31, 40), (60, 40)):
        batch = [text(2), text(words)]
        features = bucketed(batch)
        assert {name: value.shape for name, value in features.items()} == {
            "token_ids": (2, width), "segment_ids": (2, width), "padding_mask": (2, width)
        }
        reference = fixed(batch)
        assert reference["token_ids"].shape == (2, 40)
        for name in features:  # the same values; only padding is left out
            np.testing.assert_array_equal(features[name], reference[name][:, :width])
            assert not reference["padding_mask"][:, width:].any()
    pairs = bucketed(([text(10)], [text(10)]))  # [CLS] a [SEP] b [SEP]: 23 tokens
    assert pairs["token_ids"].shape == (1, 32) and pairs["segment_ids"][0, 12:23].tolist() == [1] * 11


def test_custom_bucket_lengths_and_the_cap_at_sequence_length():
    preprocessor = azk.models.BertPreprocessor(bert_tokenizer(), sequence_length=40, bucket_lengths=[24, 8])
    assert preprocessor.bucket_lengths == [8, 24]
    widths = [preprocessor([text(words)])["token_ids"].shape[1] for words in (1, 6, 7, 22, 23, 50)]
    assert widths == [8, 8, 24, 24, 40, 40]


def test_causal_lm_inputs_and_labels_share_the_bucketed_width():
    bucketed = azk.models.GPTCausalLMPreprocessor(gpt_tokenizer(), sequence_length=40, padding="buckets")
    fixed = azk.models.GPTCausalLMPreprocessor(gpt_tokenizer(), sequence_length=40, padding="max_length")
    # "ab ab ... ab" is one token a word, plus the end token: n words pack n + 1 tokens, n inputs.
    for words, width in ((3, 16), (16, 16), (17, 32), (45, 40)):
        batch = ["ab", " ".join(["ab"] * words)]
        x, y, w = bucketed(batch, sample_weight=[1.0, 2.0])
        assert x["token_ids"].shape == x["padding_mask"].shape == y.shape == w.shape == (2, width)
        x_fixed, y_fixed, w_fixed = fixed(batch, sample_weight=[1.0, 2.0])
        np.testing.assert_array_equal(x["token_ids"], x_fixed["token_ids"][:, :width])
        np.testing.assert_array_equal(y, y_fixed[:, :width])
        np.testing.assert_array_equal(w, w_fixed[:, :width])
        assert not w_fixed[:, width:].any()  # nothing cut off carried a label
    x, y, w = bucketed([" ".join(["ab"] * 16)])  # 16 inputs: the end token is the last label, inside the width
    assert y[0, 15] == 0 and w[0].tolist() == [1.0] * 16


def test_masked_lm_labels_keep_their_width_while_the_tokens_bucket():
    bucketed = azk.models.BertMaskedLMPreprocessor(
        bert_tokenizer(), sequence_length=40, mask_selection_length=3, seed=1, padding="buckets"
    )
    fixed = azk.models.BertMaskedLMPreprocessor(
        bert_tokenizer(), sequence_length=40, mask_selection_length=3, seed=1, padding="max_length"
    )
    batch = [text(5), text(9, offset=2)]
    x, y, w = bucketed(batch)
    x_fixed, y_fixed, w_fixed = fixed(batch)
    assert x["token_ids"].shape == (2, 16) and x_fixed["token_ids"].shape == (2, 40)
    assert x["mask_positions"].shape == y.shape == w.shape == (2, 3)
    np.testing.assert_array_equal(x["token_ids"], x_fixed["token_ids"][:, :16])
    np.testing.assert_array_equal(x["mask_positions"], x_fixed["mask_positions"])
    np.testing.assert_array_equal(y, y_fixed)


def test_seq2seq_encoder_and_decoder_widths_bucket_on_their_own():
    tokenizer = azk.models.TransformerTokenizer.from_characters("ab ")
    bucketed = azk.models.TransformerSeq2SeqLMPreprocessor(
        tokenizer, encoder_sequence_length=40, decoder_sequence_length=20, padding="buckets"
    )
    fixed = azk.models.TransformerSeq2SeqLMPreprocessor(
        tokenizer, encoder_sequence_length=40, decoder_sequence_length=20, padding="max_length"
    )
    batch = (["ab" * 10, "a"], ["b", "ab"])  # 21 source tokens with </s>; targets of 2 and 3 with their start / end
    x, y, w = bucketed(batch)
    x_fixed, y_fixed, w_fixed = fixed(batch)
    assert x["encoder_token_ids"].shape == x["encoder_padding_mask"].shape == (2, 32)
    assert x["decoder_token_ids"].shape == y.shape == w.shape == (2, 16)
    np.testing.assert_array_equal(x["encoder_token_ids"], x_fixed["encoder_token_ids"][:, :32])
    np.testing.assert_array_equal(x["decoder_token_ids"], x_fixed["decoder_token_ids"][:, :16])
    np.testing.assert_array_equal(y, y_fixed[:, :16])
    assert bucketed.pack_sources(["ab"])["encoder_token_ids"].shape == (1, 16)  # what generate encodes


def test_fixed_length_models_keep_padding_to_sequence_length():
    """The Reformer's chunked attention is shaped by the length (its
    backbone's `static_sequence_length`), and Transformer-XL's segments carry
    memory over: their preprocessors pad every batch to `sequence_length`."""
    from attention_zoo_keras.models.reformer.reformer_tokenizer import ReformerByteTokenizer

    for preprocessor_cls in (azk.models.ReformerPreprocessor, azk.models.ReformerCausalLMPreprocessor,
                             azk.models.ReformerMaskedLMPreprocessor):
        preprocessor = preprocessor_cls(ReformerByteTokenizer(), sequence_length=64)
        assert preprocessor.padding == "max_length"
        features = preprocessor(["Hi"])
        features = features[0] if isinstance(features, tuple) else features
        assert features["token_ids"].shape == (1, 64)
        assert not PreprocessedBatches(preprocessor, ["Hi", "Hello"]).widths_vary  # static shapes reach the graph
    assert azk.models.ReformerBackbone.static_sequence_length
    assert PreprocessedBatches(azk.models.BertPreprocessor(bert_tokenizer(), sequence_length=40), ["Hi"]).widths_vary


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="only TensorFlow graphs see an unknown width")
def test_a_bucketed_reformer_on_tensorflow_predicts_but_is_told_to_pad_to_max_length_to_train():
    """Batches of varying widths reach a TensorFlow graph with the width
    unknown: inference pads to the chunk lengths inside it (the outputs of
    `max_length` padding); training needs the width static."""
    from attention_zoo_keras.models.reformer.reformer_tokenizer import ReformerByteTokenizer

    backbone = azk.models.ReformerBackbone(
        vocabulary_size=258, hidden_dim=8, num_heads=2, head_dim=4, intermediate_dim=16, attention=["local"],
        is_causal=False, attention_options={"local": {"block_size": 8}}, axial_pos_shape=(4, 8),
        axial_pos_embds_dim=(4, 4),
    )
    preprocessor = azk.models.ReformerPreprocessor(ReformerByteTokenizer(), sequence_length=32, padding="buckets")
    classifier = azk.models.ReformerTextClassifier(backbone, num_classes=2, preprocessor=preprocessor)
    texts = ["Hi", "Hello", "a" * 20, "b" * 24]  # widths 16, 32
    fixed = azk.models.ReformerPreprocessor(ReformerByteTokenizer(), sequence_length=32)(texts)
    np.testing.assert_allclose(
        classifier.predict(texts, batch_size=2, verbose=0), classifier.predict(fixed, batch_size=2, verbose=0),
        atol=1e-5,
    )
    classifier.compile()
    with pytest.raises(ValueError, match='padding="max_length"'):
        classifier.fit(texts, np.array([0, 1, 0, 1]), batch_size=2, verbose=0)


def test_padding_settings_survive_a_preset(tmp_path):
    preprocessor = azk.models.BertPreprocessor(bert_tokenizer(), sequence_length=40, bucket_lengths=[8, 24])
    azk.models.BertTextClassifier(tiny_bert(), num_classes=2, preprocessor=preprocessor).save_to_preset(tmp_path)
    loaded = azk.models.BertPreprocessor.from_preset(str(tmp_path))
    assert (loaded.padding, loaded.bucket_lengths) == ("buckets", [8, 24])
    assert loaded([text(7)])["token_ids"].shape == (1, 24)
    fixed = azk.models.BertPreprocessor.from_preset(str(tmp_path), padding="max_length", bucket_lengths=None)
    assert fixed([text(7)])["token_ids"].shape == (1, 40)


# --- the models see the same thing --------------------------------------------


@pytest.mark.parametrize("task", ["classifier", "embedder"])
def test_bucketed_padding_gives_the_outputs_of_max_length_padding(task):
    keras.utils.set_random_seed(0)
    backbone = tiny_bert()
    texts = [text(2), text(5, offset=1), text(20, offset=3), text(1)]
    outputs, weights = {}, None
    for padding in ("buckets", "max_length"):
        preprocessor = azk.models.BertPreprocessor(bert_tokenizer(), sequence_length=40, padding=padding)
        if task == "classifier":
            model = azk.models.BertTextClassifier(backbone, num_classes=3, preprocessor=preprocessor, dropout=0.0)
        else:
            model = azk.models.BertTextEmbedder(backbone, preprocessor=preprocessor)
        if weights is None:
            weights = model.get_weights()
        else:  # the second model gets the first's weights
            model.set_weights(weights)
        outputs[padding] = model.predict(texts, batch_size=2, verbose=0)
    np.testing.assert_allclose(outputs["buckets"], outputs["max_length"], atol=1e-5)


def test_per_token_outputs_of_batches_of_different_widths_are_one_array():
    """A batch of short texts (bucket 16) and one of a long text (bucket 32):
    `predict` pads both to 32, so a language model's logits are one array
    on every backend (not a failed concatenation, nor TensorFlow's ragged
    tensor), each row's real positions as it predicts alone; the seq2seq
    model's decoder logits likewise."""
    keras.utils.set_random_seed(0)
    backbone = azk.models.GPTBackbone(vocabulary_size=6, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16,
                                      max_sequence_length=64)
    lm = azk.models.GPTCausalLM(backbone, preprocessor=azk.models.GPTCausalLMPreprocessor(gpt_tokenizer(),
                                                                                         sequence_length=64))
    texts = ["ab"] * 4 + ["ab " * 20]  # 20 tokens
    logits = lm.predict(texts, batch_size=4, verbose=0)
    assert isinstance(logits, np.ndarray) and logits.shape == (5, 32, 6)
    alone = lm.predict(texts[:1], verbose=0)
    assert alone.shape == (1, 16, 6)
    np.testing.assert_allclose(logits[0, :1], alone[0, :1], atol=1e-6)
    assert (lm.preprocessor.padding, lm.preprocessor.bucket_lengths) == ("buckets", None)  # as it was

    seq2seq = character_seq2seq(40)
    sources, targets = ["abc"] * 2 + ["ab" * 10], ["cba"] * 2 + ["ba" * 10]
    assert seq2seq.predict((sources, targets), batch_size=2, verbose=0).shape == (3, 32, 8)


def _counting(model, method):
    """Counts the calls of `model.<method>`: under a compiled `fit` /
    `predict` (JAX, TensorFlow), one per trace."""
    calls = []
    original = getattr(model, method)

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    setattr(model, method, counted)
    return calls


@pytest.mark.skipif(keras.backend.backend() == "torch", reason="torch runs eagerly (nothing is traced)")
def test_fit_and_predict_trace_once_per_bucket():
    """JAX compiles a step per width; TensorFlow gets the batches with their
    width unknown (`backend_support.batches_of_any_width`) and traces once."""
    keras.utils.set_random_seed(0)
    preprocessor = azk.models.BertPreprocessor(bert_tokenizer(), sequence_length=40)
    classifier = azk.models.BertTextClassifier(tiny_bert(), num_classes=2, preprocessor=preprocessor, dropout=0.0)
    classifier.compile(optimizer="sgd")
    # Batches of 4 (no ragged last batch): widths 16, 32, 16, 32, 16, 32.
    texts = [text(3 if batch % 2 == 0 else 20, offset=row) for batch in range(6) for row in range(4)]
    labels = np.arange(len(texts)) % 2
    widths = {preprocessor(texts[start : start + 4])["token_ids"].shape[1] for start in range(0, len(texts), 4)}
    assert widths == {16, 32}
    train_traces = _counting(classifier, "train_step")
    classifier.fit(texts, labels, batch_size=4, epochs=2, shuffle=False, verbose=0)
    predict_traces = _counting(classifier, "predict_step")
    classifier.predict(texts, batch_size=4, verbose=0)  # every batch padded to the widest, 32
    classifier.predict(texts[:4], batch_size=4, verbose=0)  # 16 (one batch, which TensorFlow traces apart)
    traced = len(predict_traces)
    classifier.predict(texts[::-1], batch_size=4, verbose=0)
    if keras.backend.backend() == "tensorflow":
        classifier.predict([text(35)] * 4, batch_size=4, verbose=0)  # a third width, 40
        classifier.predict([text(35)] * 8, batch_size=4, verbose=0)
        assert len(train_traces) == 1
        assert len(predict_traces) == traced  # no new trace for any width
    else:
        assert len(train_traces) == len(widths)  # one compiled step per shape
        assert len(predict_traces) == 2  # one per width predicted: the widest batch's (32), and 16


def test_fit_takes_later_batches_wider_than_the_first_two():
    keras.utils.set_random_seed(0)
    preprocessor = azk.models.BertPreprocessor(bert_tokenizer(), sequence_length=40)
    classifier = azk.models.BertTextClassifier(tiny_bert(), num_classes=2, preprocessor=preprocessor, dropout=0.0)
    classifier.compile(optimizer="sgd")
    texts = [text(3)] * 8 + [text(20)] * 4  # widths 16, 16, then 32
    history = classifier.fit(texts, np.arange(12) % 2, batch_size=4, epochs=1, shuffle=False, verbose=0)
    assert np.isfinite(history.history["loss"][0])


def _raw_classifier():
    keras.utils.set_random_seed(0)
    preprocessor = azk.models.BertPreprocessor(bert_tokenizer(), sequence_length=40)
    classifier = azk.models.BertTextClassifier(tiny_bert(), num_classes=2, preprocessor=preprocessor, dropout=0.0)
    classifier.compile(optimizer=keras.optimizers.SGD(0.5), weighted_metrics=[])
    return classifier


def test_validation_split_holds_out_the_last_raw_examples_as_keras_does_for_arrays():
    texts = [text(2 + index % 5, offset=index) for index in range(12)]
    labels, weights = np.arange(12) % 2, np.linspace(0.5, 2.0, 12)
    split = _raw_classifier()
    held_out = _raw_classifier()
    split_history = split.fit(texts, labels, sample_weight=weights, validation_split=0.25, batch_size=3,
                              epochs=2, shuffle=False, verbose=0)
    held_out_history = held_out.fit(texts[:9], labels[:9], sample_weight=weights[:9],
                                    validation_data=(texts[9:], labels[9:], weights[9:]), batch_size=3,
                                    epochs=2, shuffle=False, verbose=0)
    for name in ("loss", "val_loss"):
        np.testing.assert_allclose(split_history.history[name], held_out_history.history[name], rtol=1e-6)
    for got, expected in zip(split.weights, held_out.weights):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(got), keras.ops.convert_to_numpy(expected), atol=1e-6)
    # The sample weights reach the validation loss: without them it differs.
    unweighted = _raw_classifier().fit(texts[:9], labels[:9], sample_weight=weights[:9],
                                       validation_data=(texts[9:], labels[9:]), batch_size=3, epochs=2,
                                       shuffle=False, verbose=0)
    assert not np.allclose(unweighted.history["val_loss"], split_history.history["val_loss"], rtol=1e-4)


def test_validation_split_of_too_few_raw_examples_is_refused():
    with pytest.raises(ValueError, match=r"holds 3 examples, too few to hold out validation_split=0.9"):
        _raw_classifier().fit([text(2)] * 3, [0, 1, 0], validation_split=0.9, verbose=0)
    with pytest.raises(ValueError, match=r"validation_split must be between 0 and 1; got 1.5"):
        _raw_classifier().fit([text(2)] * 3, [0, 1, 0], validation_split=1.5, verbose=0)


# --- raw input that is not text -------------------------------------------------


def test_a_bad_text_is_named_by_its_position_in_the_data():
    preprocessor = azk.models.BertPreprocessor(bert_tokenizer(), sequence_length=16)
    classifier = azk.models.BertTextClassifier(tiny_bert(16), num_classes=2, preprocessor=preprocessor)
    texts = [text(3)] * 12
    texts[9] = None
    with pytest.raises(TypeError, match=r"Text 9 is None, not a string"):
        classifier.fit(texts, np.zeros(12, "int32"), batch_size=4, verbose=0)
    texts[9] = "the plot \ud800"
    with pytest.raises(ValueError, match=r"Text 9 is not valid Unicode: it holds the lone surrogate '\\ud800'"):
        classifier.predict(texts, batch_size=4, verbose=0)
    texts[9] = 3
    with pytest.raises(TypeError, match=r"Text 9 is a value of type int \(3\)"):
        classifier.evaluate(texts, np.zeros(12, "int32"), batch_size=4, verbose=0)


# --- one example -----------------------------------------------------------------


def _same(a, b):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)


def test_one_text_or_one_text_pair_is_one_example():
    """`fit` / `predict` / `evaluate` take one string (or one tuple of
    strings) as a batch of one, never its characters."""
    keras.utils.set_random_seed(0)
    preprocessor = azk.models.BertPreprocessor(bert_tokenizer(), sequence_length=16)
    classifier = azk.models.BertTextClassifier(tiny_bert(16), num_classes=2, dropout=0.0, preprocessor=preprocessor)
    assert preprocessor.examples("a great film", [0]) == ["a great film"]
    _same(classifier.predict("a great film", verbose=0), classifier.predict(["a great film"], verbose=0))
    _same(classifier.predict(("a film", "dull"), verbose=0), classifier.predict((["a film"], ["dull"]), verbose=0))
    assert classifier.evaluate("a great film", [1], verbose=0) == classifier.evaluate(["a great film"], [1], verbose=0)

    seq2seq = character_seq2seq(8)
    assert seq2seq.evaluate(("abc", "cba"), verbose=0) == seq2seq.evaluate((["abc"], ["cba"]), verbose=0)


def test_one_image_is_one_example():
    """An `(height, width, channels)` array, a grayscale `(height, width)`
    one and a PIL image are each a batch of one; a boolean array is refused
    naming its dtype."""
    from PIL import Image

    keras.utils.set_random_seed(0)
    classifier = azk.models.ViTImageClassifier(
        azk.models.ViTBackbone(image_size=16, patch_size=8, num_layers=1, num_heads=2, hidden_dim=8,
                               intermediate_dim=16),
        num_classes=3, preprocessor=azk.models.ViTImageConverter(image_size=16))
    image = np.random.default_rng(0).integers(0, 256, size=(20, 20, 3), dtype="uint8")
    batch_of_one = classifier.predict(image[None], verbose=0)
    _same(classifier.predict(image, verbose=0), batch_of_one)
    _same(classifier.predict(Image.fromarray(image), verbose=0), batch_of_one)
    gray = image[:, :, 0]
    _same(classifier.predict(gray, verbose=0), classifier.predict(gray[None, :, :, None], verbose=0))
    with pytest.raises(TypeError, match="Image 0 is an array of booleans"):
        classifier.predict(np.ones((2, 17, 23, 3), bool), verbose=0)


def test_one_vilbert_question_is_one_example_and_unpaired_inputs_are_named():
    vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "what", "colour", "is", "the", "sofa", "?"]
    preprocessor = azk.models.ViLBERTPreprocessor(
        azk.models.BertTokenizer.from_vocabulary(vocabulary), sequence_length=8, max_regions=4)
    backbone = azk.models.ViLBERTBackbone(
        vocabulary_size=11, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16, region_feature_dim=6,
        visual_num_layers=1, visual_num_heads=2, visual_hidden_dim=4, visual_intermediate_dim=8,
        co_attention_dim=4, co_attention_num_heads=2, co_attention_text_layers=[1], co_attention_visual_layers=[0],
        max_sequence_length=8)
    vqa = azk.models.ViLBERTVisualQuestionAnswerer(backbone, num_answers=5, dropout=0.0, preprocessor=preprocessor)
    raw = {"text": "what colour is the sofa?", "regions": [np.ones((2, 6), "float32")],
           "boxes": [np.array([[0, 0, 50, 40], [10, 10, 100, 80]], "float32")], "image_size": (80, 100)}
    assert preprocessor.examples(raw, [0])["text"] == ["what colour is the sofa?"]
    _same(vqa.predict(raw, verbose=0), vqa.predict({**raw, "text": [raw["text"]]}, verbose=0))
    with pytest.raises(ValueError, match="Got 3 texts, 1 entries of regions and 1 of boxes; give one entry per example"):
        vqa.predict({**raw, "text": ["what", "is", "the"]}, verbose=0)
