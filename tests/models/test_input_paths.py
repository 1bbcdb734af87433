"""Every input path of `fit` / `evaluate` / `predict` / `*_on_batch` checks
each batch before the compiled graph (issue 19, item 2).

An out-of-vocabulary id or a class label out of range, arriving by arrays,
a Python generator, a `keras.utils.PyDataset`, a `tf.data.Dataset`, a torch
`DataLoader` or `validation_data`, raises the library's own `ValueError`
on every backend, and leaves the weights as they were (on JAX it used to
train on clamped ids and fill the weights with NaN). Good data still flows
through each wrapper with its length and epochs.
"""

import keras
import numpy as np
import pytest

from attention_zoo_keras.models import BertBackbone
from attention_zoo_keras.models import BertPreprocessor
from attention_zoo_keras.models import BertTextClassifier
from attention_zoo_keras.models import BertTokenizer

VOCABULARY = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat"]
LENGTH = 6
OUT_OF_VOCABULARY = 99
BAD_ID = r"'token_ids' holds the id 99, outside the valid range \[0, 10\)"
BAD_LABEL = r"The labels hold the class 5; there are 2 classes"


def _classifier():
    backbone = BertBackbone(
        vocabulary_size=len(VOCABULARY), num_layers=1, num_heads=1, hidden_dim=4, intermediate_dim=8,
        max_sequence_length=LENGTH,
    )
    preprocessor = BertPreprocessor(BertTokenizer.from_vocabulary(VOCABULARY), sequence_length=LENGTH)
    classifier = BertTextClassifier(backbone, num_classes=2, preprocessor=preprocessor, dropout=0.0)
    classifier.compile(optimizer=keras.optimizers.SGD(0.1))
    return classifier


def _features(token=5):
    token_ids = np.full((2, LENGTH), 5, dtype="int32")
    token_ids[0, 1] = token
    return {
        "token_ids": token_ids,
        "segment_ids": np.zeros((2, LENGTH), dtype="int32"),
        "padding_mask": np.ones((2, LENGTH), dtype="int32"),
    }


def _batch(token=5, label=1):
    return _features(token), np.array([label, 0], dtype="int32")


class Batches(keras.utils.PyDataset):
    """`num_batches` copies of one batch; counts the epochs it has seen end."""

    def __init__(self, batch, num_batches=2):
        super().__init__()
        self.batch, self.num_batches_, self.epochs_ended = batch, num_batches, 0

    def __len__(self):
        return self.num_batches_

    def __getitem__(self, index):
        return self.batch

    def on_epoch_end(self):
        self.epochs_ended += 1


def _generator(batch, num_batches=2):
    for _ in range(num_batches):
        yield batch


def _tf_dataset(batch):
    tf = pytest.importorskip("tensorflow")
    features, labels = batch
    return tf.data.Dataset.from_tensor_slices((features, labels)).batch(2)


def _data_loader(batch):
    torch = pytest.importorskip("torch")
    features, labels = batch

    class Rows(torch.utils.data.Dataset):
        def __len__(self):
            return len(labels)

        def __getitem__(self, index):
            return {key: value[index] for key, value in features.items()}, labels[index]

    return torch.utils.data.DataLoader(Rows(), batch_size=2)


SOURCES = {
    "generator": _generator,
    "py_dataset": Batches,
    "tf_data": _tf_dataset,
    "torch_data_loader": _data_loader,
}

# Each path: (how it runs a bad batch on the classifier, what the error says).
FIT_PATHS = {
    **{f"fit_{name}_id": (lambda m, make=make: m.fit(make(_batch(token=OUT_OF_VOCABULARY)), verbose=0), BAD_ID)
       for name, make in SOURCES.items()},
    **{f"fit_{name}_label": (lambda m, make=make: m.fit(make(_batch(label=5)), verbose=0), BAD_LABEL)
       for name, make in SOURCES.items()},
    "fit_arrays_id": (lambda m: m.fit(*_batch(token=OUT_OF_VOCABULARY), verbose=0), BAD_ID),
    "fit_arrays_label": (lambda m: m.fit(*_batch(label=5), verbose=0), BAD_LABEL),
    "fit_validation_arrays_label": (
        lambda m: m.fit(*_batch(), validation_data=_batch(label=5), verbose=0), BAD_LABEL
    ),
    "train_on_batch_id": (lambda m: m.train_on_batch(*_batch(token=OUT_OF_VOCABULARY)), BAD_ID),
    "train_on_batch_label": (lambda m: m.train_on_batch(*_batch(label=5)), BAD_LABEL),
}

# Validation batches that are made while `fit` runs are checked after the
# epoch has trained on good data: the weights then differ, but stay finite.
VALIDATION_PATHS = {
    "fit_validation_generator_id": (
        lambda m: m.fit(*_batch(), validation_data=_generator(_batch(token=OUT_OF_VOCABULARY)), verbose=0), BAD_ID
    ),
    "fit_validation_py_dataset_label": (
        lambda m: m.fit(*_batch(), validation_data=Batches(_batch(label=5)), verbose=0), BAD_LABEL
    ),
    "fit_validation_tf_data_id": (
        lambda m: m.fit(*_batch(), validation_data=_tf_dataset(_batch(token=OUT_OF_VOCABULARY)), verbose=0), BAD_ID
    ),
    "fit_validation_torch_data_loader_label": (
        lambda m: m.fit(*_batch(), validation_data=_data_loader(_batch(label=5)), verbose=0), BAD_LABEL
    ),
}

OTHER_PATHS = {
    "evaluate_generator_id": (lambda m: m.evaluate(_generator(_batch(token=OUT_OF_VOCABULARY)), verbose=0), BAD_ID),
    "evaluate_py_dataset_label": (lambda m: m.evaluate(Batches(_batch(label=5)), verbose=0), BAD_LABEL),
    "test_on_batch_label": (lambda m: m.test_on_batch(*_batch(label=5)), BAD_LABEL),
    "predict_generator_id": (
        lambda m: m.predict(_generator(_features(OUT_OF_VOCABULARY)), verbose=0), BAD_ID
    ),
    "predict_py_dataset_id": (lambda m: m.predict(Batches((_features(OUT_OF_VOCABULARY),)), verbose=0), BAD_ID),
    "predict_tf_data_id": (
        lambda m: m.predict(_tf_dataset(_batch(token=OUT_OF_VOCABULARY)).map(lambda x, y: x), verbose=0), BAD_ID
    ),
    "predict_on_batch_id": (lambda m: m.predict_on_batch(_features(OUT_OF_VOCABULARY)), BAD_ID),
}


def _weights(model):
    return [keras.ops.convert_to_numpy(weight).copy() for weight in model.weights]


@pytest.fixture(scope="module")
def classifier():
    return _classifier()


@pytest.mark.parametrize("path", sorted(FIT_PATHS))
def test_fit_checks_every_batch_and_keeps_the_weights(classifier, path):
    run, message = FIT_PATHS[path]
    before = _weights(classifier)
    with pytest.raises(ValueError, match=message):
        run(classifier)
    after = _weights(classifier)
    assert all(np.isfinite(weight).all() for weight in after)
    for old, new in zip(before, after):
        np.testing.assert_array_equal(old, new)


@pytest.mark.parametrize("path", sorted(VALIDATION_PATHS))
def test_fit_checks_every_validation_batch(classifier, path):
    run, message = VALIDATION_PATHS[path]
    with pytest.raises(ValueError, match=message):
        run(classifier)
    assert all(np.isfinite(weight).all() for weight in _weights(classifier))


@pytest.mark.parametrize("path", sorted(OTHER_PATHS))
def test_evaluate_and_predict_check_every_batch(classifier, path):
    run, message = OTHER_PATHS[path]
    with pytest.raises(ValueError, match=message):
        run(classifier)


def test_a_bad_batch_after_good_ones_stops_training_with_finite_weights(classifier):
    batches = [_batch(), _batch(), _batch(token=OUT_OF_VOCABULARY)]
    with pytest.raises(ValueError, match=BAD_ID):
        classifier.fit((batch for batch in batches), verbose=0)
    assert all(np.isfinite(weight).all() for weight in _weights(classifier))
    assert classifier.predict(_features(), verbose=0).shape == (2, 2)  # still usable


@pytest.mark.parametrize("source", sorted(SOURCES))
def test_good_batches_train_through_each_wrapper(classifier, source):
    before = _weights(classifier)
    history = classifier.fit(SOURCES[source](_batch()), verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    assert any(not np.array_equal(old, new) for old, new in zip(before, _weights(classifier)))


def test_a_checked_py_dataset_keeps_its_length_and_epochs(classifier):
    batches = Batches(_batch(), num_batches=3)
    history = classifier.fit(batches, epochs=2, verbose=0)
    assert len(history.history["loss"]) == 2
    assert batches.epochs_ended >= 2  # the wrapped dataset's hook runs after each epoch: it can reshuffle


def test_a_checked_data_loader_keeps_its_length_and_epochs(classifier):
    loader = _data_loader(_batch())
    history = classifier.fit(loader, epochs=2, verbose=0)
    assert len(history.history["loss"]) == 2
    assert classifier.predict(loader, verbose=0).shape == (2, 2)


def test_a_checked_tf_dataset_keeps_its_cardinality_and_epochs(classifier):
    dataset = _tf_dataset((_features(), np.array([1, 0]))).repeat(3)
    history = classifier.fit(dataset, epochs=2, verbose=0)
    assert len(history.history["loss"]) == 2
    assert classifier.predict(dataset.map(lambda x, y: x), verbose=0).shape == (6, 2)


def test_raw_text_batches_check_their_labels(classifier):
    with pytest.raises(ValueError, match=BAD_LABEL):
        classifier.fit(["the cat", "the mat"], [5, 0], verbose=0)
    with pytest.raises(ValueError, match=BAD_LABEL):
        classifier.fit(["the cat"], [1], validation_data=(["the mat"], [5]), verbose=0)


@pytest.mark.parametrize("x", [[], None, {}], ids=["empty_list", "none", "empty_dict"])
@pytest.mark.parametrize("method", ["fit", "evaluate", "predict"])
def test_no_examples_is_the_librarys_error(classifier, method, x):
    with pytest.raises(ValueError, match=rf"BertTextClassifier\.{method}\(\) got no examples \(x=.*\)\. It takes a dict"):
        getattr(classifier, method)(x, verbose=0)


def test_a_backbone_predicts_none_with_the_librarys_error(classifier):
    with pytest.raises(ValueError, match=r"BertBackbone\.predict\(\) got no examples \(x=None\)"):
        classifier.backbone.predict(None, verbose=0)


# --- next-token labels of the language models ------------------------------------


def _causal_lm():
    from attention_zoo_keras.models import GPTBackbone
    from attention_zoo_keras.models import GPTCausalLM

    backbone = GPTBackbone(
        vocabulary_size=12, num_layers=1, num_heads=1, hidden_dim=4, intermediate_dim=4, max_sequence_length=8
    )
    return GPTCausalLM(backbone=backbone), {"token_ids": np.ones((2, 4), "int32"), "padding_mask": np.ones((2, 4), "int32")}


def _seq2seq_lm():
    from attention_zoo_keras.models import TransformerBackbone
    from attention_zoo_keras.models import TransformerSeq2SeqLM

    backbone = TransformerBackbone(
        vocabulary_size=12, num_encoder_layers=1, num_decoder_layers=1, num_heads=1, hidden_dim=4,
        intermediate_dim=4, max_sequence_length=8,
    )
    ones = np.ones((2, 4), "int32")
    features = {
        "encoder_token_ids": ones, "encoder_padding_mask": ones, "decoder_token_ids": ones, "decoder_padding_mask": ones,
    }
    return TransformerSeq2SeqLM(backbone), features


@pytest.mark.parametrize("make", [_causal_lm, _seq2seq_lm], ids=["causal", "seq2seq"])
def test_language_model_labels_outside_the_vocabulary_are_refused(make):
    model, features = make()
    model.compile(optimizer="sgd")
    before = _weights(model)
    labels = np.full((2, 4), 12, "int32")  # one past the vocabulary
    with pytest.raises(ValueError, match=r"'labels' holds the id 12, outside the valid range \[0, 12\)"):
        model.fit(features, labels, epochs=1, verbose=0)
    with pytest.raises(ValueError, match="'labels' holds the id 12"):
        model.train_on_batch(features, labels)
    for old, new in zip(before, _weights(model)):
        np.testing.assert_array_equal(old, new)
    model.train_on_batch(features, np.full((2, 4), 11, "int32"))  # the last id is fine
