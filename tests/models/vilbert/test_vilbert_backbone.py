"""ViLBERTBackbone against the authors' own code (facebookresearch/vilbert-multi-task
at f22b84a, `BertModel` inside `VILBertForVLTasks`, eval mode) on a golden
fixture with random perturbed weights (tolerance: 1e-4 absolute, fp32)."""

import keras
import numpy as np
import pytest

from attention_zoo_keras.models.vilbert import ViLBERTBackbone
from attention_zoo_keras.models.vilbert.vilbert_convert import vilbert_arrays
from attention_zoo_keras.models.vilbert.vilbert_convert import vilbert_backbone_config
from tests.support.family_tests import run_backbone_test
from tests.support.family_tests import run_config_round_trip_test
from tests.support.tiny_models import vilbert_features
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
    inputs = our_inputs(load("inputs"))
    run_config_round_trip_test(backbone, inputs, outputs=lambda model: {key: model(inputs)[key] for key in OUTPUTS})


def test_backbone_behaviour(tmp_path):
    arguments = dict(
        vocabulary_size=20, num_layers=2, num_heads=2, hidden_dim=8, intermediate_dim=16, region_feature_dim=4,
        visual_num_layers=2, visual_num_heads=2, visual_hidden_dim=8, visual_intermediate_dim=16,
        co_attention_dim=8, co_attention_num_heads=2, co_attention_text_layers=[1, 2],
        co_attention_visual_layers=[0, 1], max_sequence_length=8,
    )
    shapes = {"sequence_output": (2, 6, 8), "visual_sequence_output": (2, 3, 8), "pooled_output": (2, 8),
              "visual_pooled_output": (2, 8)}
    run_backbone_test(
        ViLBERTBackbone, arguments, vilbert_features(2), shapes, tmp_path,
        variable_input_data=[(vilbert_features(3), {"sequence_output": (3, 6, 8)})],
    )
