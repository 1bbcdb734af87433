"""`compile(jit_compile=True)` on torch: `predict` and `evaluate` run the
forward pass compiled by TorchInductor, once per input signature, with the
eager call's outputs; dynamo compiles exactly one graph over repeated calls
(Keras' own `torch.compile` of the step, which recompiles on every call, is
left out)."""

import keras
import numpy as np
import pytest

import attention_zoo_keras as azk

pytestmark = [
    pytest.mark.skipif(keras.backend.backend() != "torch", reason="TorchInductor is torch's compiler"),
    pytest.mark.slow,  # TorchInductor compiles C++ kernels: tens of seconds on a small CPU
]


def _classifier():
    keras.utils.set_random_seed(0)
    backbone = azk.models.BertBackbone(
        vocabulary_size=50, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16, max_sequence_length=16,
    )
    classifier = azk.models.BertTextClassifier(backbone, num_classes=3, dropout=0.0)
    classifier.compile(jit_compile=True, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return classifier


def _features(rng, batch, length):
    features = {
        "token_ids": rng.integers(0, 50, (batch, length)).astype("int32"),
        "segment_ids": np.zeros((batch, length), "int32"),
        "padding_mask": np.ones((batch, length), "int32"),
    }
    features["padding_mask"][batch // 2 :, length // 2 :] = 0
    return features


def test_predict_and_evaluate_compile_one_graph_and_match_the_eager_call():
    from torch._dynamo.utils import counters

    classifier = _classifier()
    rng = np.random.default_rng(0)
    x = _features(rng, 8, 12)
    labels = rng.integers(0, 3, 8)
    counters.clear()
    for _ in range(3):
        predictions = classifier.predict(x, batch_size=4, verbose=0)
    eager = keras.ops.convert_to_numpy(classifier(x, training=False))
    np.testing.assert_allclose(predictions, eager, atol=1e-5)
    loss = classifier.evaluate(x, labels, batch_size=4, verbose=0, return_dict=True)["loss"]
    logits = eager - eager.max(axis=-1, keepdims=True)
    expected = np.mean(np.log(np.exp(logits).sum(axis=-1)) - logits[np.arange(8), labels])
    np.testing.assert_allclose(loss, expected, rtol=1e-5)
    assert len(classifier.traced_signatures) == 1
    assert counters["stats"]["unique_graphs"] == 1  # one dynamo graph for 6 predict and 2 evaluate batches
