"""LoRA (`enable_lora`, issue 21) on every family's task: only the LoRA
matrices of the named layers train (and a task's head), the settings and
matrices round-trip through a preset with the same outputs, merging gives
the same outputs without LoRA layers, and bad settings are clear errors."""

import keras
import numpy as np
import pytest

import attention_zoo_keras as azk
from tests.support.tiny_models import from_preset_like
from tests.support.tiny_models import outputs_of
from tests.support.tiny_models import task_cases
from tests.support.tiny_models import tiny_gpt
from tests.support.tiny_models import zero_targets
from tests.support.tiny_models import weights_of

LORA_MATRICES = ("lora_kernel_a", "lora_kernel_b", "lora_embeddings_a", "lora_embeddings_b")


def _trained_with_lora(case, **lora):
    """The case's model with LoRA enabled and one SGD step taken."""
    keras.utils.set_random_seed(0)
    model, x = task_cases()[case]()
    y = zero_targets(model, x)
    model.enable_lora(2, **lora)
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss="mse", metrics=[], weighted_metrics=[])
    before = weights_of(model)
    model.train_on_batch(x, y)
    return model, x, before


@pytest.mark.parametrize("case", sorted(task_cases()))
def test_lora_trains_only_its_matrices_and_round_trips_through_a_preset(case, tmp_path):
    model, x, before = _trained_with_lora(case)
    backbone = getattr(model, "backbone", model)
    backbone_keys = {variable.path for variable in backbone.weights}

    trainable = sorted(variable.path for variable in backbone.trainable_weights)
    assert trainable and all(key.rsplit("/", 1)[1] in LORA_MATRICES for key in trainable)
    assert {key.split("/")[-2] for key in trainable} == {"query", "value"}
    after = weights_of(model)
    changed = {key for key in before if not np.array_equal(before[key], after[key])}
    assert {key for key in changed if key in backbone_keys} <= set(trainable)
    assert any(key.endswith("lora_kernel_b") for key in changed)  # B starts at zero; one step moves it

    model.save_to_preset(tmp_path)
    loaded = from_preset_like(model, tmp_path)

    assert loaded_settings(loaded) == {"rank": 2, "target_names": ["query", "value"], "lora_alpha": 2}
    assert sorted(v.path for v in getattr(loaded, "backbone", loaded).trainable_weights) == trainable
    for actual, expected in zip(outputs_of(loaded, x), outputs_of(model, x)):
        np.testing.assert_array_equal(actual, expected)


def loaded_settings(model):
    return getattr(model, "backbone", model).lora_settings


@pytest.mark.parametrize("case", sorted(task_cases()))
def test_merging_gives_the_same_outputs_without_lora_layers(case, tmp_path):
    model, x, _ = _trained_with_lora(case, target_names=("query", "value", "intermediate"))

    merged = model.merge_lora()

    assert loaded_settings(merged) is None
    assert not [v.path for v in merged.weights if v.path.rsplit("/", 1)[1] in LORA_MATRICES]
    for actual, expected in zip(outputs_of(merged, x), outputs_of(model, x)):
        np.testing.assert_allclose(actual, expected, atol=1e-5, rtol=1e-5)
    merged.save_to_preset(tmp_path)  # a plain preset
    assert loaded_settings(from_preset_like(merged, tmp_path)) is None


def test_a_quantized_model_takes_lora_and_round_trips(tmp_path):
    """QLoRA: LoRA matrices (float) over int8 weights."""
    keras.utils.set_random_seed(0)
    lm = azk.models.GPTCausalLM(tiny_gpt())
    lm.quantize("int8")
    lm.enable_lora(2)
    x = {"token_ids": np.array([[3, 4, 5, 6]], "int32"), "padding_mask": np.ones((1, 4), "int32")}
    for variable in lm.backbone.trainable_weights:
        variable.assign(np.full(variable.shape, 0.1, "float32"))
    lm.save_to_preset(tmp_path)
    loaded = azk.models.GPTCausalLM.from_preset(tmp_path, preprocessor=None)
    np.testing.assert_array_equal(outputs_of(loaded, x)[0], outputs_of(lm, x)[0])
    dtypes = {variable.path: keras.backend.standardize_dtype(variable.dtype) for variable in loaded.weights}
    assert dtypes["transformer_layer_0/self_attention/query/kernel"] == "int8"
    assert dtypes["transformer_layer_0/self_attention/query/lora_kernel_a"] == "float32"


def test_an_unknown_target_name_is_an_error_naming_the_layers_that_take_lora():
    lm = azk.models.GPTCausalLM(tiny_gpt())
    with pytest.raises(ValueError, match=r"'quary'.*Did you mean.*query.*named: .*intermediate.*value"):
        lm.enable_lora(2, target_names=("quary", "value"))
    assert lm.backbone.lora_settings is None and lm.backbone.trainable_weights


@pytest.mark.parametrize("rank", [0, 2.5, True])
def test_a_rank_that_is_not_a_positive_integer_is_an_error(rank):
    with pytest.raises(ValueError, match="rank must be a positive integer"):
        tiny_gpt().enable_lora(rank)


def test_lora_is_enabled_once():
    backbone = tiny_gpt()
    backbone.enable_lora(2)
    with pytest.raises(ValueError, match="already enabled"):
        backbone.enable_lora(4)
