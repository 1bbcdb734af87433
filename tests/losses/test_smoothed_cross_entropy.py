"""Label-smoothed sparse cross-entropy equals PyTorch's
`cross_entropy(label_smoothing=ε)`, honours padding weights as Keras losses
do, reduces to plain sparse cross-entropy at ε = 0, and trains."""

import keras
import numpy as np
import pytest
import torch

from attention_zoo_keras.losses import SparseCategoricalCrossentropyWithLabelSmoothing

BATCH, LENGTH, VOCABULARY = 3, 7, 11


def random_batch(seed=0, scale=3.0):
    """Logits, labels and padding weights (1 on tokens, 0 on each row's padded tail)."""
    rng = np.random.default_rng(seed)
    logits = (scale * rng.standard_normal((BATCH, LENGTH, VOCABULARY))).astype("float32")
    labels = rng.integers(0, VOCABULARY, size=(BATCH, LENGTH))
    lengths = np.array([LENGTH, 4, 1])
    weights = (np.arange(LENGTH)[None, :] < lengths[:, None]).astype("float32")
    return logits, labels, weights


def torch_per_position(logits, labels, label_smoothing):
    """`torch.nn.functional.cross_entropy(..., reduction="none")` per position."""
    losses = torch.nn.functional.cross_entropy(
        torch.tensor(logits).reshape(-1, VOCABULARY),
        torch.tensor(labels).reshape(-1),
        label_smoothing=label_smoothing,
        reduction="none",
    )
    return losses.reshape(labels.shape).numpy().astype("float64")


def numpy(x):
    return keras.ops.convert_to_numpy(x)


@pytest.mark.parametrize("label_smoothing", [0.1, 0.3])
@pytest.mark.parametrize("reduction", [None, "sum", "sum_over_batch_size", "mean_with_sample_weight"])
def test_matches_torch_cross_entropy_with_padding_weights(label_smoothing, reduction):
    logits, labels, weights = random_batch()
    loss = SparseCategoricalCrossentropyWithLabelSmoothing(label_smoothing, reduction=reduction)
    ours = numpy(loss(labels, logits, sample_weight=weights))
    weighted = torch_per_position(logits, labels, label_smoothing) * weights
    expected = {
        None: weighted,
        "sum": weighted.sum(),
        "sum_over_batch_size": weighted.sum() / labels.size,
        "mean_with_sample_weight": weighted.sum() / weights.sum(),
    }[reduction]
    np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-5)


def test_token_mean_matches_torch_ignore_index():
    logits, labels, weights = random_batch(seed=1)
    loss = SparseCategoricalCrossentropyWithLabelSmoothing(0.1, reduction="mean_with_sample_weight")
    ignored = np.where(weights > 0, labels, -100)
    expected = torch.nn.functional.cross_entropy(
        torch.tensor(logits).reshape(-1, VOCABULARY),
        torch.tensor(ignored).reshape(-1),
        label_smoothing=0.1,
        ignore_index=-100,
    )
    np.testing.assert_allclose(numpy(loss(labels, logits, sample_weight=weights)), expected.item(), rtol=1e-5)


def test_matches_keras_categorical_crossentropy_with_label_smoothing():
    logits, labels, weights = random_batch(seed=2)
    ours = SparseCategoricalCrossentropyWithLabelSmoothing(0.2)(labels, logits, sample_weight=weights)
    dense = keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=0.2)
    expected = dense(np.eye(VOCABULARY, dtype="float32")[labels], logits, sample_weight=weights)
    np.testing.assert_allclose(numpy(ours), numpy(expected), rtol=1e-5)


def test_without_smoothing_equals_sparse_categorical_crossentropy():
    logits, labels, weights = random_batch(seed=3)
    ours = SparseCategoricalCrossentropyWithLabelSmoothing(label_smoothing=0.0)
    plain = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    np.testing.assert_allclose(
        numpy(ours(labels, logits, sample_weight=weights)),
        numpy(plain(labels, logits, sample_weight=weights)),
        rtol=1e-5,
    )


def test_probabilities_and_trailing_label_axis_give_the_same_loss():
    logits, labels, weights = random_batch(seed=4, scale=1.0)
    from_logits = SparseCategoricalCrossentropyWithLabelSmoothing(0.1)(labels, logits, sample_weight=weights)
    probabilities = numpy(keras.ops.softmax(logits, axis=-1))
    from_probabilities = SparseCategoricalCrossentropyWithLabelSmoothing(0.1, from_logits=False)
    np.testing.assert_allclose(
        numpy(from_probabilities(labels, probabilities, sample_weight=weights)), numpy(from_logits), rtol=1e-5
    )
    trailing_axis = SparseCategoricalCrossentropyWithLabelSmoothing(0.1)
    np.testing.assert_allclose(
        numpy(trailing_axis(labels[..., None], logits, sample_weight=weights)), numpy(from_logits), rtol=1e-6
    )


def gradient_of_summed_loss(loss, labels, logits, weights):
    """d loss(labels, logits, weights) / d logits, on the active backend."""
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        return np.asarray(jax.grad(lambda x: loss(labels, x, sample_weight=weights))(logits))
    if backend == "tensorflow":
        import tensorflow as tf

        tensor = tf.constant(logits)
        with tf.GradientTape() as tape:
            tape.watch(tensor)
            value = loss(labels, tensor, sample_weight=weights)
        return tape.gradient(value, tensor).numpy()
    tensor = torch.tensor(logits, requires_grad=True)
    loss(labels, tensor, sample_weight=weights).backward()
    return tensor.grad.numpy()


@pytest.mark.parametrize("scale", [3.0, 1e4])
def test_gradient_is_finite_and_is_softmax_minus_smoothed_target(scale):
    logits, labels, weights = random_batch(seed=5, scale=scale)
    loss = SparseCategoricalCrossentropyWithLabelSmoothing(0.1, reduction="sum")
    gradient = gradient_of_summed_loss(loss, labels, logits, weights)
    assert np.all(np.isfinite(gradient))
    shifted = logits.astype("float64") - logits.max(axis=-1, keepdims=True)
    softmax = np.exp(shifted) / np.exp(shifted).sum(axis=-1, keepdims=True)
    smoothed_target = 0.9 * np.eye(VOCABULARY)[labels] + 0.1 / VOCABULARY
    np.testing.assert_allclose(gradient, (softmax - smoothed_target) * weights[..., None], atol=1e-5)


def test_trains_inside_fit_with_padding_weights():
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(6)
    tokens = rng.integers(1, VOCABULARY, size=(32, LENGTH))
    weights = (rng.random((32, LENGTH)) < 0.8).astype("float32")
    model = keras.Sequential(
        [
            keras.Input((LENGTH,), dtype="int32"),
            keras.layers.Embedding(VOCABULARY, 16),
            keras.layers.Dense(VOCABULARY),
        ]
    )
    loss = SparseCategoricalCrossentropyWithLabelSmoothing(0.1)
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss=loss)
    history = model.fit(tokens, tokens, sample_weight=weights, batch_size=8, epochs=5, verbose=0)
    losses = history.history["loss"]
    assert np.all(np.isfinite(losses)) and losses[-1] < 0.5 * losses[0], losses
    evaluated = model.evaluate(tokens, tokens, sample_weight=weights, batch_size=32, verbose=0)
    direct = loss(tokens, model.predict(tokens, verbose=0), sample_weight=weights)
    np.testing.assert_allclose(evaluated, numpy(direct), rtol=1e-5)


def test_serialization_round_trip():
    loss = SparseCategoricalCrossentropyWithLabelSmoothing(0.2, from_logits=False, reduction="sum", name="smoothed")
    serialized = keras.saving.serialize_keras_object(loss)
    assert serialized["registered_name"] == f"attention_zoo_keras>{type(loss).__name__}"
    restored = keras.saving.deserialize_keras_object(serialized)
    assert isinstance(restored, SparseCategoricalCrossentropyWithLabelSmoothing)
    assert restored.get_config() == loss.get_config()
    assert (restored.label_smoothing, restored.from_logits, restored.reduction) == (0.2, False, "sum")


@pytest.mark.parametrize("label_smoothing", [-0.1, 1.5])
def test_label_smoothing_outside_zero_one_is_refused(label_smoothing):
    with pytest.raises(ValueError, match=r"label_smoothing must be in \[0, 1\]"):
        SparseCategoricalCrossentropyWithLabelSmoothing(label_smoothing)
