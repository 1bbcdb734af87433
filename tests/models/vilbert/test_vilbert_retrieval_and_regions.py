"""ViLBERTImageTextRetriever (`vil_logit`) and ViLBERTRegionScorer
(`vision_logit`, with the authors' −10000 on padded regions) against the
authors' own code (facebookresearch/vilbert-multi-task at f22b84a,
`VILBertForVLTasks`, eval mode) on the golden fixture (tolerance: 1e-4
absolute, fp32)."""

import keras
import numpy as np
import pytest

from attention_zoo_keras.hub.weights import variables_by_key
from attention_zoo_keras.models.vilbert import ViLBERTBackbone
from attention_zoo_keras.models.vilbert import ViLBERTImageTextRetriever
from attention_zoo_keras.models.vilbert import ViLBERTRegionScorer
from attention_zoo_keras.models.vilbert.vilbert_convert import vilbert_arrays
from attention_zoo_keras.models.vilbert.vilbert_convert import vilbert_backbone_config
from attention_zoo_keras.models.vilbert.vilbert_convert import vilbert_retrieval_head_arrays
from attention_zoo_keras.models.vilbert.vilbert_region_scorer import region_hit
from attention_zoo_keras.models.vilbert.vilbert_convert import vilbert_region_scorer_head_arrays
from tests.support.vilbert_golden import load
from tests.support.vilbert_golden import our_inputs

ATOL = 1e-4


def converted(task_cls, head_arrays, authors_config, **arguments):
    state_dict = load("model")
    task = task_cls(ViLBERTBackbone(**vilbert_backbone_config(authors_config)), **arguments)
    arrays = {**vilbert_arrays(state_dict, authors_config), **head_arrays(state_dict)}
    task.assign_arrays(arrays, "vilbert fixture")
    assert set(arrays) == set(variables_by_key(task))
    return task


@pytest.fixture(scope="module")
def retriever(authors_config):
    return converted(
        ViLBERTImageTextRetriever, vilbert_retrieval_head_arrays, authors_config, fusion=authors_config["fusion_method"]
    )


@pytest.fixture(scope="module")
def region_scorer(authors_config):
    return converted(ViLBERTRegionScorer, vilbert_region_scorer_head_arrays, authors_config)


def with_candidates(inputs, candidates):
    return {name: value.reshape(-1, candidates, *value.shape[1:]) for name, value in inputs.items()}


def test_retrieval_scores_match_the_authors_vil_logit(retriever):
    expected = load("outputs")["vil_logit"]  # (4, 1)
    inputs = our_inputs(load("inputs"))
    one_candidate = keras.ops.convert_to_numpy(retriever(with_candidates(inputs, 1)))
    assert one_candidate.shape == (4, 1)
    np.testing.assert_allclose(one_candidate, expected, atol=ATOL)
    # the authors' view(batch_size, num_options): pairs grouped two by two
    grouped = retriever.predict(with_candidates(inputs, 2), verbose=0)
    assert grouped.shape == (2, 2)
    np.testing.assert_allclose(grouped, expected.reshape(2, 2), atol=ATOL)


def test_retrieval_loss_is_cross_entropy_over_the_candidates(retriever):
    inputs = with_candidates(our_inputs(load("inputs")), 2)
    match = np.array([1, 0])
    retriever.compile()
    loss = retriever.evaluate(inputs, match, verbose=0, return_dict=True)["loss"]
    scores = load("outputs")["vil_logit"].reshape(2, 2)
    log_probabilities = scores - np.log(np.exp(scores).sum(-1, keepdims=True))
    np.testing.assert_allclose(loss, -log_probabilities[np.arange(2), match].mean(), rtol=1e-4)


def test_retrieval_inputs_need_a_candidates_axis(retriever):
    with pytest.raises(ValueError, match="candidates axis"):
        retriever(our_inputs(load("inputs")))


def test_retrieval_candidates_must_agree(retriever):
    inputs = with_candidates(our_inputs(load("inputs")), 2)
    inputs["region_mask"] = inputs["region_mask"].reshape(1, 4, -1)
    with pytest.raises(ValueError, match="same batch and candidates sizes"):
        retriever(inputs)


def test_retrieval_checks_the_pairs_as_the_backbone_does(retriever):
    inputs = with_candidates(our_inputs(load("inputs")), 2)
    inputs["token_ids"] = inputs["token_ids"].copy()
    inputs["token_ids"][1, 1, 2] = 99
    with pytest.raises(ValueError, match="token_ids.*outside the valid range"):
        retriever(inputs)


def test_region_scores_match_the_authors_vision_logit(region_scorer):
    expected = load("outputs")["vision_logit"][..., 0]  # (4, 6), −10000 added on padded regions
    inputs = our_inputs(load("inputs"))
    actual = keras.ops.convert_to_numpy(region_scorer(inputs))
    assert actual.shape == expected.shape == (4, 6)
    np.testing.assert_allclose(actual, expected, atol=ATOL)
    padded = inputs["region_mask"] == 0
    assert padded.any() and (actual[padded] < -9000).all()


def test_region_hit_is_the_authors_accuracy():
    # their batch score: the target of the argmax region, counted when > 0.5
    targets = np.array([[0.0, 0.7, 0.0], [0.4, 0.0, 0.9], [0.0, 0.0, 0.55]], "float32")
    logits = np.array([[0.1, 2.0, -1.0], [3.0, 0.0, 1.0], [0.0, -1.0, 0.5]], "float32")
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(region_hit(targets, logits)), [1.0, 0.0, 1.0])


def test_region_scorer_config_round_trip(region_scorer):
    config = region_scorer.get_config()
    rebuilt = ViLBERTRegionScorer.from_config(config)
    rebuilt.set_weights(region_scorer.get_weights())
    inputs = our_inputs(load("inputs"))
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(rebuilt(inputs)), keras.ops.convert_to_numpy(region_scorer(inputs)), atol=1e-6
    )


def test_missing_heads_in_state_dict():
    no_heads = {"bert.embeddings.word_embeddings.weight": np.zeros((2, 2))}
    with pytest.raises(ValueError, match="vil_logit"):
        vilbert_retrieval_head_arrays(no_heads)
    with pytest.raises(ValueError, match="vision_logit"):
        vilbert_region_scorer_head_arrays(no_heads)
