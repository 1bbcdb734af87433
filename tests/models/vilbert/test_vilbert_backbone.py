"""ViLBERTBackbone against the authors' own code (facebookresearch/vilbert-multi-task
at f22b84a, `BertModel` inside `VILBertForVLTasks`, eval mode) on a golden
fixture with random perturbed weights (tolerance: 1e-4 absolute, fp32)."""

import keras
import numpy as np
import pytest

from attention_zoo_keras.models.vilbert import ViLBERTBackbone
from attention_zoo_keras.models.vilbert.vilbert_convert import vilbert_arrays
from attention_zoo_keras.models.vilbert.vilbert_convert import vilbert_backbone_config
from tests.support.vilbert_golden import load
from tests.support.vilbert_golden import our_inputs

ATOL = 1e-4

OUTPUTS = {
    "sequence_output": "sequence_output_t",
    "visual_sequence_output": "sequence_output_v",
    "pooled_output": "pooled_output_t",
    "visual_pooled_output": "pooled_output_v",
}


@pytest.fixture(scope="module")
def backbone(authors_config):
    model = ViLBERTBackbone(**vilbert_backbone_config(authors_config))
    model.assign_arrays(vilbert_arrays(load("model"), authors_config), "vilbert fixture")
    return model


def test_outputs_match_the_authors_code(backbone):
    expected = load("outputs")
    outputs = backbone(our_inputs(load("inputs")))
    for ours, theirs in OUTPUTS.items():
        actual = keras.ops.convert_to_numpy(outputs[ours])
        assert actual.shape == expected[theirs].shape, ours
        np.testing.assert_allclose(actual, expected[theirs], atol=ATOL, err_msg=ours)


def test_every_backbone_weight_comes_from_the_checkpoint(backbone, authors_config):
    from attention_zoo_keras.hub.weights import variables_by_key

    arrays = vilbert_arrays(load("model"), authors_config)
    assert set(arrays) == set(variables_by_key(backbone))


def test_state_dict_without_bert_prefix(authors_config):
    state_dict = {k.removeprefix("bert."): v for k, v in load("model").items() if k.startswith("bert.")}
    with_prefix = vilbert_arrays(load("model"), authors_config)
    without = vilbert_arrays(state_dict, authors_config)
    assert set(with_prefix) == set(without)


def test_not_a_vilbert_state_dict(authors_config):
    with pytest.raises(ValueError, match="not a ViLBERT checkpoint"):
        vilbert_arrays({"embeddings.word_embeddings.weight": np.zeros((2, 2))}, authors_config)


def test_unsupported_authors_options(authors_config):
    with pytest.raises(ValueError, match="dynamic_attention"):
        vilbert_backbone_config({**authors_config, "dynamic_attention": True})


def test_region_features_of_the_wrong_width(backbone):
    inputs = our_inputs(load("inputs"))
    inputs["region_features"] = np.zeros((4, 6, 7), "float32")
    with pytest.raises(ValueError, match="region_features"):
        backbone(inputs)


def test_text_and_regions_of_different_batch_sizes(backbone):
    inputs = our_inputs(load("inputs"))
    for name in ("region_features", "region_boxes", "region_mask"):
        inputs[name] = inputs[name][:3]
    with pytest.raises(ValueError, match="same batch size"):
        backbone(inputs)


def test_inconsistent_co_attention_schedule(authors_config):
    config = vilbert_backbone_config(authors_config)
    with pytest.raises(ValueError, match="equally long"):
        ViLBERTBackbone(**{**config, "co_attention_text_layers": [2]})
    with pytest.raises(ValueError, match="non-decreasing"):
        ViLBERTBackbone(**{**config, "co_attention_visual_layers": [2, 1]})


def test_get_config_round_trip(backbone):
    config = backbone.get_config()
    rebuilt = ViLBERTBackbone.from_config(config)
    assert rebuilt.get_config() == config
    rebuilt.set_weights(backbone.get_weights())
    inputs = our_inputs(load("inputs"))
    for ours in OUTPUTS:
        np.testing.assert_allclose(
            keras.ops.convert_to_numpy(rebuilt(inputs)[ours]),
            keras.ops.convert_to_numpy(backbone(inputs)[ours]),
            atol=1e-6,
        )
