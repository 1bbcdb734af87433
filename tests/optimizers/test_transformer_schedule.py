"""The Transformer's learning-rate schedule follows §5.3 of the paper, and
its optimizer is Adam with the paper's betas and epsilon."""

import keras
import numpy as np
import pytest

import attention_zoo_keras as azk
from attention_zoo_keras.optimizers import TransformerSchedule
from attention_zoo_keras.optimizers import transformer_schedule


def paper_rate(step, hidden_dim, warmup_steps, scale=1.0):
    """lrate of §5.3 at the paper's 1-based step."""
    return scale * hidden_dim**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)


@pytest.mark.parametrize(
    "hidden_dim, warmup_steps, scale", [(512, 4000, 1.0), (1024, 4000, 1.0), (256, 100, 2.0)]
)
def test_rate_follows_the_formula_at_keras_step_plus_one(hidden_dim, warmup_steps, scale):
    schedule = TransformerSchedule(hidden_dim, warmup_steps=warmup_steps, scale=scale)
    steps = [0, 1, 10, warmup_steps // 2, warmup_steps - 2, warmup_steps - 1, warmup_steps, 3 * warmup_steps, 10**5]
    for step in steps:
        expected = paper_rate(step + 1, hidden_dim, warmup_steps, scale)
        assert float(schedule(step)) == pytest.approx(expected, rel=1e-6), step


def test_first_update_has_a_non_zero_rate_and_the_peak_is_at_the_end_of_warmup():
    schedule = TransformerSchedule(hidden_dim=512, warmup_steps=40)
    rates = keras.ops.convert_to_numpy(schedule(np.arange(200)))
    assert rates[0] > 0
    assert int(np.argmax(rates)) == 39
    assert rates[39] == pytest.approx((512 * 40) ** -0.5, rel=1e-6)
    assert np.all(np.diff(rates[:40]) > 0) and np.all(np.diff(rates[40:]) < 0)


def test_schedule_serialization_round_trip():
    schedule = TransformerSchedule(hidden_dim=256, warmup_steps=100, scale=2.0)
    serialized = keras.saving.serialize_keras_object(schedule)
    assert serialized["registered_name"] == "attention_zoo_keras>TransformerSchedule"
    restored = keras.saving.deserialize_keras_object(serialized)
    assert isinstance(restored, TransformerSchedule)
    assert restored.get_config() == {"hidden_dim": 256, "warmup_steps": 100, "scale": 2.0}
    assert float(restored(57)) == float(schedule(57))


def test_optimizer_is_adam_with_the_papers_hyperparameters_and_round_trips():
    optimizer = azk.optimizers.transformer_schedule(hidden_dim=512, warmup_steps=4000, clipnorm=1.0)
    assert isinstance(optimizer, keras.optimizers.Adam)
    assert (optimizer.beta_1, optimizer.beta_2, optimizer.epsilon) == (0.9, 0.98, 1e-9)
    assert optimizer.clipnorm == 1.0
    restored = keras.optimizers.Adam.from_config(optimizer.get_config())
    assert isinstance(restored._learning_rate, TransformerSchedule)
    assert restored._learning_rate.get_config() == {"hidden_dim": 512, "warmup_steps": 4000, "scale": 1.0}
    assert (restored.beta_1, restored.beta_2, restored.epsilon) == (0.9, 0.98, 1e-9)
    adam_overridden = transformer_schedule(hidden_dim=512, beta_2=0.997)
    assert adam_overridden.beta_2 == 0.997


def test_rate_during_fit_is_the_formula_at_the_step_count():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer=transformer_schedule(hidden_dim=64, warmup_steps=10), loss="mse")
    model.fit(np.ones((12, 3), "float32"), np.ones((12, 1), "float32"), batch_size=4, epochs=1, verbose=0)
    assert int(model.optimizer.iterations) == 3
    assert float(model.optimizer.learning_rate) == pytest.approx(paper_rate(4, 64, 10), rel=1e-6)


@pytest.mark.parametrize(
    "arguments, message",
    [
        ({"hidden_dim": 0}, "hidden_dim must be a positive int"),
        ({"hidden_dim": 512.0}, "hidden_dim must be a positive int"),
        ({"hidden_dim": 512, "warmup_steps": 0}, "warmup_steps must be a positive int"),
        ({"hidden_dim": 512, "scale": -1.0}, "scale must be positive"),
    ],
)
def test_bad_arguments_are_named(arguments, message):
    with pytest.raises(ValueError, match=message):
        TransformerSchedule(**arguments)


def test_learning_rate_cannot_be_overridden():
    with pytest.raises(TypeError, match="sets the learning rate itself"):
        transformer_schedule(hidden_dim=512, learning_rate=1e-3)
