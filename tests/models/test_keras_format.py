"""Keras' own format, `model.save("model.keras")` / `keras.saving.load_model`
(and so `keras.callbacks.ModelCheckpoint`), keeps a task whole on every
backend: its preprocessor (tokenizer or image converter, so the loaded task
takes raw inputs), its `compile()` arguments and its optimizer's state (the
next training epoch gives both the same weights)."""

import json
import zipfile

import keras
import numpy as np
import pytest

import attention_zoo_keras as azk
from attention_zoo_keras.registration import UnregisteredClassError

WORDS = ["a", "great", "film", "the", "plot", "was", "dull"]
VOCABULARY = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]


def _texts(count):
    return [" ".join(WORDS[(3 * row + column) % len(WORDS)] for column in range(2 + row % 4)) for row in range(count)]


def _bert_classifier():
    backbone = azk.models.BertBackbone(
        vocabulary_size=len(VOCABULARY), num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16,
        max_sequence_length=16, dropout=0.0, attention_dropout=0.0,
    )
    preprocessor = azk.models.BertPreprocessor(azk.models.BertTokenizer.from_vocabulary(VOCABULARY), sequence_length=16)
    return azk.models.BertTextClassifier(backbone, num_classes=2, dropout=0.0, preprocessor=preprocessor), _texts(8), np.arange(8) % 2


def _gpt_causal_lm():
    vocabulary = {"<|endoftext|>": 0, "a": 1, "b": 2, "Ġ": 3, "ab": 4, "Ġab": 5}
    tokenizer = azk.models.GPTTokenizer.from_vocabulary(vocabulary, [("a", "b"), ("Ġ", "ab")])
    backbone = azk.models.GPTBackbone(
        vocabulary_size=len(vocabulary), num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16,
        max_sequence_length=16, dropout=0.0, attention_dropout=0.0,
    )
    preprocessor = azk.models.GPTCausalLMPreprocessor(tokenizer, sequence_length=8)
    return azk.models.GPTCausalLM(backbone, preprocessor=preprocessor), ["ab ab a", "b ab", "a b ab ab", "ab"], None


def _vit_classifier():
    backbone = azk.models.ViTBackbone(image_size=16, patch_size=8, num_layers=1, num_heads=2, hidden_dim=8,
                                      intermediate_dim=16, dropout=0.0)
    converter = azk.models.ViTImageConverter(image_size=16)
    images = np.random.default_rng(0).integers(0, 256, (8, 20, 24, 3)).astype("uint8")  # resized by the converter
    return azk.models.ViTImageClassifier(backbone, num_classes=3, preprocessor=converter), images, np.arange(8) % 3


CASES = {"bert_classifier": _bert_classifier, "gpt_causal_lm": _gpt_causal_lm, "vit_classifier": _vit_classifier}


def _fit(model, x, y):
    return model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)


def _weights(model):
    return {variable.path: keras.ops.convert_to_numpy(variable) for variable in model.weights}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_task_saved_as_keras_loads_with_its_preprocessor_and_optimizer(case, tmp_path):
    keras.utils.set_random_seed(0)
    model, x, y = CASES[case]()
    model.compile(optimizer=keras.optimizers.Adam(1e-2))
    checkpoint = keras.callbacks.ModelCheckpoint(str(tmp_path / "model.keras"))
    model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0, callbacks=[checkpoint])

    loaded = keras.saving.load_model(tmp_path / "model.keras")
    assert type(loaded) is type(model) and type(loaded.preprocessor) is type(model.preprocessor)
    assert loaded.preprocessor.get_config() == model.preprocessor.get_config()
    np.testing.assert_allclose(loaded.predict(x, verbose=0), model.predict(x, verbose=0), atol=1e-6)
    if case == "gpt_causal_lm":
        assert loaded.generate(x, max_length=8) == model.generate(x, max_length=8)
    # compile() and the optimizer's state: one more epoch from each gives the same weights.
    assert loaded.compiled and type(loaded.optimizer) is type(model.optimizer)
    assert int(loaded.optimizer.iterations) == int(model.optimizer.iterations) == -(-len(x) // 4)
    _fit(model, x, y)
    _fit(loaded, x, y)
    expected, got = _weights(model), _weights(loaded)
    for path, value in expected.items():
        np.testing.assert_allclose(got[path], value, atol=1e-6, err_msg=path)


def test_a_task_without_a_preprocessor_loads_without_one(tmp_path):
    model, x, y = _bert_classifier()
    features = model.preprocessor(x)
    model.preprocessor = None
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(features, y, verbose=0)
    model.save(tmp_path / "model.keras")
    loaded = keras.saving.load_model(tmp_path / "model.keras")
    assert loaded.preprocessor is None and isinstance(loaded.optimizer, keras.optimizers.SGD)
    np.testing.assert_allclose(loaded.predict(features, verbose=0), model.predict(features, verbose=0), atol=1e-6)


def test_a_preprocessor_file_naming_an_unregistered_class_is_refused(tmp_path):
    model, _, _ = _bert_classifier()
    model.save(tmp_path / "model.keras")
    with zipfile.ZipFile(tmp_path / "model.keras") as archive:
        entries = {name: archive.read(name) for name in archive.namelist()}
    (name,) = [name for name in entries if name.endswith("preprocessor.json")]
    saved = json.loads(entries[name])
    entries[name] = json.dumps({**saved, "class_name": "os.system"}).encode()
    with zipfile.ZipFile(tmp_path / "edited.keras", "w") as archive:
        for entry, data in entries.items():
            archive.writestr(entry, data)
    with pytest.raises((UnregisteredClassError, ValueError), match="os.system.*not registered"):
        keras.saving.load_model(tmp_path / "edited.keras")
