"""The family test helpers fail on broken models: a config that forgets an
argument, a layer that ignores the dtype policy, a preset that reloads other
weights, a task whose fit trains nothing, a wrong output shape."""

import keras
import numpy as np
import pytest

from attention_zoo_keras.models.gpt import GPTBackbone
from attention_zoo_keras.models.gpt import GPTCausalLM
from tests.support import family_tests

INPUTS = np.arange(6, dtype="float32").reshape(2, 3)


@keras.saving.register_keras_serializable(package="family_tests_test")
class Scaled(keras.Model):
    """`Dense(x) * scale`; `forgets_scale` leaves `scale` out of the config
    and `float32_head` computes in float32 whatever the policy."""

    def __init__(self, scale=1.0, forgets_scale=False, float32_head=False, **kwargs):
        super().__init__(**kwargs)
        self.scale, self.forgets_scale, self.float32_head = scale, forgets_scale, float32_head
        self.dense = keras.layers.Dense(2, dtype="float32" if float32_head else self.dtype_policy)
        self.dense.build((None, 3))

    def call(self, inputs):
        return self.dense(inputs) * self.scale

    def get_config(self):
        config = {**super().get_config(), "forgets_scale": self.forgets_scale, "float32_head": self.float32_head}
        return config if self.forgets_scale else {**config, "scale": self.scale}


def built(**kwargs):
    model = Scaled(**kwargs)
    model(INPUTS)
    return model


def tiny_gpt_kwargs():
    return dict(vocabulary_size=20, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16, max_sequence_length=8)


GPT_INPUTS = {"token_ids": np.ones((2, 4), "int32"), "padding_mask": np.ones((2, 4), "int32")}


def test_a_sound_model_passes(tmp_path):
    family_tests.run_config_round_trip_test(built(scale=3.0), INPUTS)
    family_tests.run_saving_test(built(scale=3.0), INPUTS, tmp_path)
    family_tests.run_precision_test(Scaled, {"scale": 3.0}, INPUTS)


def test_a_config_that_forgets_an_argument_fails_the_round_trips(tmp_path):
    with pytest.raises(AssertionError, match="from_config"):
        family_tests.run_config_round_trip_test(built(scale=3.0, forgets_scale=True), INPUTS)
    with pytest.raises(AssertionError, match="saving to .keras"):
        family_tests.run_saving_test(built(scale=3.0, forgets_scale=True), INPUTS, tmp_path)


def test_a_layer_ignoring_the_policy_fails_the_precision_test():
    with pytest.raises(AssertionError, match="mixed_bfloat16"):
        family_tests.run_precision_test(Scaled, {"float32_head": True}, INPUTS)


def test_a_preset_that_reloads_other_weights_fails(tmp_path, monkeypatch):
    backbone = GPTBackbone(**tiny_gpt_kwargs())
    monkeypatch.setattr(GPTBackbone, "from_preset", classmethod(lambda cls, *args, **kwargs: cls(**tiny_gpt_kwargs())))
    with pytest.raises(AssertionError):
        family_tests.run_preset_test(backbone, tmp_path / "preset", GPT_INPUTS)


def test_a_task_whose_fit_trains_nothing_fails():
    lm = GPTCausalLM(GPTBackbone(**tiny_gpt_kwargs()))
    lm.compile(optimizer=keras.optimizers.SGD(0.0))
    with pytest.raises(AssertionError, match="fit changed no weight"):
        family_tests.run_task_test(lm, GPT_INPUTS, GPT_INPUTS["token_ids"], expected_output_shape=(2, 4, 20))


def test_a_wrong_output_shape_fails(tmp_path):
    with pytest.raises(AssertionError):
        family_tests.run_backbone_test(
            GPTBackbone, tiny_gpt_kwargs(), GPT_INPUTS, {"sequence_output": (2, 4, 9)}, tmp_path,
            run_precision_check=False,
        )
