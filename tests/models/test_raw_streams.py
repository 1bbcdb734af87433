"""Raw batches streamed by a generator, a `keras.utils.PyDataset`, a
`tf.data.Dataset` or a torch `DataLoader` (texts and labels, as KerasHub's
examples feed `tf.data` of strings; images) are preprocessed batch by batch
on every backend: `fit`, `evaluate` and `predict` give what they give on the
same examples as raw arrays, batches wider than the first two included; the
`*_on_batch` methods take raw arrays too; a bad text in a streamed batch
gets the library's error; text given to a model without a preprocessor is
told so."""

import keras
import numpy as np
import pytest

import attention_zoo_keras as azk

VOCABULARY = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "great", "film", "the", "plot", "was", "dull"]
WORDS = VOCABULARY[5:]
# Batches of 4: [CLS] + words + [SEP] fit 16 tokens in the first two batches, 32 in the third.
TEXTS = [" ".join(WORDS[(row + column) % len(WORDS)] for column in range(2 + row % 3)) for row in range(8)] + [
    " ".join(WORDS[(row + column) % len(WORDS)] for column in range(20 + row)) for row in range(4)
]
LABELS = np.arange(12) % 2
BATCH = 4


def _classifier():
    keras.utils.set_random_seed(0)
    backbone = azk.models.BertBackbone(
        vocabulary_size=len(VOCABULARY), num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16,
        max_sequence_length=40, dropout=0.0, attention_dropout=0.0,
    )
    preprocessor = azk.models.BertPreprocessor(azk.models.BertTokenizer.from_vocabulary(VOCABULARY), sequence_length=40)
    classifier = azk.models.BertTextClassifier(backbone, num_classes=2, dropout=0.0, preprocessor=preprocessor)
    classifier.compile(optimizer=keras.optimizers.SGD(0.5))
    return classifier


class _Batches(keras.utils.PyDataset):
    def __init__(self, *arrays):
        super().__init__()
        self.arrays = arrays

    def __len__(self):
        return -(-len(self.arrays[0]) // BATCH)

    def __getitem__(self, index):
        part = tuple(array[index * BATCH : (index + 1) * BATCH] for array in self.arrays)
        return part if len(part) > 1 else part[0]


def _stream(kind, *arrays):
    """`arrays` (texts, then labels if given) in batches of `BATCH`, carried by `kind`."""
    if kind == "generator":
        return (tuple(array[start : start + BATCH] for array in arrays) for start in range(0, len(arrays[0]), BATCH))
    if kind == "py_dataset":
        return _Batches(*arrays)
    if kind == "tf_data":
        tf = pytest.importorskip("tensorflow")
        return tf.data.Dataset.from_tensor_slices(tuple(arrays) if len(arrays) > 1 else arrays[0]).batch(BATCH)
    torch = pytest.importorskip("torch")
    pairs = list(zip(*arrays)) if len(arrays) > 1 else list(arrays[0])
    return torch.utils.data.DataLoader(pairs, batch_size=BATCH, shuffle=False)


KINDS = ["generator", "py_dataset", "tf_data", "data_loader"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_stream_of_raw_batches_trains_evaluates_and_predicts_as_raw_arrays(kind):
    texts, labels = np.array(TEXTS), LABELS.astype("int32")
    expected = _classifier()
    expected_loss = expected.fit(TEXTS, LABELS, batch_size=BATCH, shuffle=False, verbose=0).history["loss"]
    streamed = _classifier()
    loss = streamed.fit(_stream(kind, texts, labels), verbose=0).history["loss"]
    np.testing.assert_allclose(loss, expected_loss, rtol=1e-5)
    for got, want in zip(streamed.weights, expected.weights):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(got), keras.ops.convert_to_numpy(want), atol=1e-6)
    np.testing.assert_allclose(streamed.evaluate(_stream(kind, texts, labels), verbose=0),
                               expected.evaluate(TEXTS, LABELS, batch_size=BATCH, verbose=0), rtol=1e-5)
    np.testing.assert_allclose(streamed.predict(_stream(kind, texts), verbose=0),
                               expected.predict(TEXTS, batch_size=BATCH, verbose=0), atol=1e-6)


def test_the_on_batch_methods_take_raw_arrays():
    raw, features = _classifier(), _classifier()
    batch = features.preprocessor(TEXTS[:BATCH])
    labels = LABELS[:BATCH]
    np.testing.assert_allclose(raw.train_on_batch(TEXTS[:BATCH], labels), features.train_on_batch(batch, labels), rtol=1e-6)
    np.testing.assert_allclose(raw.test_on_batch(TEXTS[:BATCH], labels), features.test_on_batch(batch, labels), rtol=1e-6)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(raw.predict_on_batch(TEXTS[:BATCH])),
                               keras.ops.convert_to_numpy(features.predict_on_batch(batch)), atol=1e-6)


def test_a_stream_of_raw_images_is_converted_batch_by_batch():
    keras.utils.set_random_seed(0)
    backbone = azk.models.ViTBackbone(image_size=16, patch_size=8, num_layers=1, num_heads=2, hidden_dim=8,
                                      intermediate_dim=16, dropout=0.0)
    classifier = azk.models.ViTImageClassifier(backbone, num_classes=3,
                                               preprocessor=azk.models.ViTImageConverter(image_size=16))
    images = np.random.default_rng(0).integers(0, 256, (8, 20, 24, 3)).astype("uint8")  # resized by the converter
    expected = classifier.predict(images, batch_size=BATCH, verbose=0)
    np.testing.assert_allclose(classifier.predict(_stream("generator", images), verbose=0), expected, atol=1e-6)
    np.testing.assert_allclose(classifier.predict(_stream("py_dataset", images), verbose=0), expected, atol=1e-6)


def test_a_bad_text_in_a_streamed_batch_is_named():
    texts = list(TEXTS)
    texts[5] = None
    batches = ((texts[start : start + BATCH], LABELS[start : start + BATCH]) for start in range(0, 12, BATCH))
    with pytest.raises(TypeError, match=r"Text 1 is None, not a string"):  # the second batch's second text
        _classifier().fit(batches, verbose=0)


def test_text_for_a_model_without_a_preprocessor_is_told_so():
    classifier = _classifier()
    classifier.preprocessor = None
    with pytest.raises(ValueError, match=r"predict\(\) got text, but the model has no preprocessor.*token_ids"):
        classifier.predict(TEXTS, verbose=0)
    with pytest.raises(ValueError, match=r"fit\(\) got text, but the model has no preprocessor"):
        classifier.fit(np.array(TEXTS), LABELS, verbose=0)
