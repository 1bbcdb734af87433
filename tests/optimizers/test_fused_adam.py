"""`FusedAdam` / `FusedAdamW` compute Keras' Adam / AdamW (on torch through
one fused kernel), with schedules, clipping and weight decay."""

import keras
import numpy as np
import pytest

from attention_zoo_keras.optimizers import FusedAdam
from attention_zoo_keras.optimizers import FusedAdamW
from attention_zoo_keras.optimizers import TransformerSchedule


def _trained_weights(optimizer):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(5), keras.layers.Dense(2)])
    model.compile(optimizer=optimizer, loss="mse")
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(32, 3)).astype("float32"), rng.normal(size=(32, 2)).astype("float32")
    model.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0)  # 16 steps
    return model.get_weights()


@pytest.mark.parametrize(
    "fused, keras_optimizer",
    [
        (lambda: FusedAdam(0.01), lambda: keras.optimizers.Adam(0.01)),
        (lambda: FusedAdam(TransformerSchedule(8, warmup_steps=4), beta_2=0.98, epsilon=1e-9, clipnorm=0.5),
         lambda: keras.optimizers.Adam(TransformerSchedule(8, warmup_steps=4), beta_2=0.98, epsilon=1e-9, clipnorm=0.5)),
        (lambda: FusedAdamW(0.01, weight_decay=0.1), lambda: keras.optimizers.AdamW(0.01, weight_decay=0.1)),
        (lambda: FusedAdam(0.01, amsgrad=True), lambda: keras.optimizers.Adam(0.01, amsgrad=True)),
    ],
    ids=["adam", "schedule_and_clipnorm", "adamw", "amsgrad"],
)
def test_the_updates_are_keras_adams(fused, keras_optimizer):
    expected = _trained_weights(keras_optimizer())
    for actual, reference in zip(_trained_weights(fused()), expected):
        np.testing.assert_allclose(actual, reference, atol=2e-6, rtol=1e-5)


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="torch's fused kernel")
def test_torch_runs_one_fused_kernel_per_step(monkeypatch):
    import torch

    calls = []
    kernel = torch._fused_adam_

    def counted(*args, **kwargs):
        calls.append(len(args[0]))
        return kernel(*args, **kwargs)

    monkeypatch.setattr(torch, "_fused_adam_", counted)
    _trained_weights(FusedAdam(0.01))
    assert calls == [4] * 16  # every step, all four variables in one call


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="torch's fused kernel")
def test_torch_runs_one_fused_kernel_per_dtype_and_both_kinds_of_weight_move(monkeypatch):
    """A model with float32 and bfloat16 weights: one kernel call per dtype
    (the kernel takes tensors of one kind), not Keras' own step for all."""
    import torch

    calls = []
    kernel = torch._fused_adam_

    def counted(*args, **kwargs):
        calls.append((len(args[0]), args[0][0].dtype))
        return kernel(*args, **kwargs)

    monkeypatch.setattr(torch, "_fused_adam_", counted)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(5), keras.layers.Dense(2, dtype="bfloat16")])
    model.compile(optimizer=FusedAdam(0.01), loss="mse")
    before = [keras.ops.convert_to_numpy(keras.ops.cast(weight, "float32")) for weight in model.weights]
    model.fit(np.ones((4, 3), "float32"), np.zeros((4, 2), "float32"), batch_size=4, epochs=2, verbose=0)
    assert calls == [(2, torch.float32), (2, torch.bfloat16)] * 2
    after = [keras.ops.convert_to_numpy(keras.ops.cast(weight, "float32")) for weight in model.weights]
    assert all(not np.array_equal(old, new) for old, new in zip(before, after))


def test_a_fused_optimizer_survives_serialization():
    optimizer = FusedAdamW(0.02, weight_decay=0.3, beta_2=0.98)
    restored = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    assert type(restored) is FusedAdamW
    assert (restored.weight_decay, restored.beta_2) == (0.3, 0.98)


def test_gradients_laid_out_unlike_their_weights_update_the_right_elements():
    """A recorded backward pass may hand over a kernel's gradient as a
    transposed view; the update must follow the values, not the memory."""
    rng = np.random.default_rng(0)
    initial = rng.normal(size=(3, 4)).astype("float32")
    gradient = rng.normal(size=(4, 3)).astype("float32")
    results = []
    for optimizer in (FusedAdam(0.1), keras.optimizers.Adam(0.1)):
        weight = keras.Variable(initial)
        optimizer.build([weight])
        transposed = keras.ops.transpose(keras.ops.convert_to_tensor(gradient))  # a view on torch
        for _ in range(2):
            optimizer.apply([transposed], [weight])
        results.append(keras.ops.convert_to_numpy(weight))
    np.testing.assert_allclose(results[0], results[1], atol=1e-6, rtol=1e-5)


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="torch's fused kernel")
@pytest.mark.parametrize("learning_rate", [0.01, TransformerSchedule(8, warmup_steps=4)], ids=["constant", "schedule"])
def test_a_torch_update_reads_no_value_to_the_host(monkeypatch, learning_rate):
    """On a GPU a value read into Python waits for every queued kernel; the
    step count and the learning rate stay on the device."""
    import torch

    weight = keras.Variable(np.ones((3, 4), "float32"))
    optimizer = FusedAdam(learning_rate)
    optimizer.build([weight])
    gradient = keras.ops.ones((3, 4))
    optimizer.apply([gradient], [weight])  # Keras' first call may look at values while it sets up

    def refuse(*args):
        raise AssertionError("a tensor's value was read to the host")

    for reader in ("item", "tolist", "numpy", "__bool__", "__float__", "__int__", "__index__"):
        monkeypatch.setattr(torch.Tensor, reader, refuse)
    optimizer.apply([gradient], [weight])
    monkeypatch.undo()
    reference = keras.optimizers.Adam(learning_rate)
    expected = keras.Variable(np.ones((3, 4), "float32"))
    reference.build([expected])
    for _ in range(2):
        reference.apply([gradient], [expected])
    np.testing.assert_allclose(keras.ops.convert_to_numpy(weight), keras.ops.convert_to_numpy(expected), rtol=1e-6)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("optimizer", [FusedAdam, FusedAdamW], ids=["adam", "adamw"])
def test_low_precision_variables_take_the_float32_step_rounded(dtype, optimizer):
    """Keras' Adam leaves bfloat16 variables where they are (β₂ = 0.999 is 1
    in bfloat16, so its bias correction is 0); these move them by the
    float32 step, rounded once to the variable's dtype, on every backend."""
    import ml_dtypes

    numpy_dtype = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}[dtype]
    start = np.array([1.0, -2.0, 0.5], "float32")
    gradients = [np.array([0.3, -0.2, 0.05], "float32"), np.array([0.1, 0.4, -0.3], "float32")]
    variable = keras.Variable(start, dtype=dtype)
    fused = optimizer(0.1) if optimizer is FusedAdam else optimizer(0.1, weight_decay=0.0)
    m = v = np.zeros(3, "float64")
    expected = start.astype(numpy_dtype)
    for step, gradient in enumerate(gradients, 1):
        fused.apply([keras.ops.convert_to_tensor(gradient.astype(numpy_dtype))], [variable])
        g = gradient.astype(numpy_dtype).astype("float64")
        m, v = 0.9 * m + 0.1 * g, 0.999 * v + 0.001 * g * g
        m, v = m.astype(numpy_dtype).astype("float64"), v.astype(numpy_dtype).astype("float64")  # kept in the dtype
        step_size = 0.1 * np.sqrt(1 - 0.999**step) / (1 - 0.9**step)
        expected = (expected.astype("float64") - step_size * m / (np.sqrt(v) + 1e-7)).astype(numpy_dtype)
    actual = keras.ops.convert_to_numpy(keras.ops.cast(variable, "float32"))
    assert not np.allclose(actual, start, atol=0.05)  # it moved (Keras' own Adam: not at all)
    np.testing.assert_allclose(actual, expected.astype("float32"), rtol=1e-2, atol=1e-2)


def test_a_bfloat16_model_with_an_embedding_trains():
    """An embedding table's gradient (on TensorFlow `tf.IndexedSlices`) too."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((2,), dtype="int32"), keras.layers.Embedding(5, 4, dtype="bfloat16"), keras.layers.Flatten(),
        keras.layers.Dense(1, dtype="bfloat16"),
    ])
    model.compile(optimizer=FusedAdamW(0.05), loss="mse")
    x = np.array([[0, 1], [2, 3], [4, 0], [1, 2]], "int32")
    y = np.array([[1.0], [-1.0], [0.5], [-0.5]], "float32")
    table = keras.ops.convert_to_numpy(keras.ops.cast(model.layers[0].embeddings, "float32"))
    losses = model.fit(x, y, epochs=20, batch_size=4, verbose=0).history["loss"]
    assert losses[-1] < 0.5 * losses[0]
    assert not np.array_equal(table, keras.ops.convert_to_numpy(keras.ops.cast(model.layers[0].embeddings, "float32")))
