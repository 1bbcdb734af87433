"""Tasks train only the weights their outputs depend on
(`models.unused_weights`), on every backend: a task's `unused_layers` hold
exactly the weights whose gradient the backend's autodiff finds absent (torch,
TensorFlow) or zero (JAX), and `fit` leaves them as they were (no weight decay
on JAX, no "Gradients do not exist" warning on torch and TensorFlow) while
they stay trainable on the backbone."""

import warnings

import keras
import numpy as np
import pytest

import attention_zoo_keras as azk
from tests.support.tiny_models import random_ids
from tests.support.tiny_models import task_cases
from tests.support.tiny_models import text_features
from tests.support.tiny_models import tiny_bert
from tests.support.tiny_models import tiny_reformer
from tests.support.tiny_models import vilbert_features
from tests.support.tiny_models import weights_of

M = azk.models
rng = np.random.default_rng(3)


def _vilbert(num_layers=2, text_layers=(0, 1), visual_layers=(0, 1), num_task_tokens=0):
    return M.ViLBERTBackbone(
        vocabulary_size=20, num_layers=num_layers, num_heads=2, hidden_dim=8, intermediate_dim=16,
        region_feature_dim=4, visual_num_layers=1, visual_num_heads=2, visual_hidden_dim=8,
        visual_intermediate_dim=16, co_attention_dim=8, co_attention_num_heads=2,
        co_attention_text_layers=list(text_layers), co_attention_visual_layers=list(visual_layers),
        max_sequence_length=8, num_task_tokens=num_task_tokens, dropout=0.0, visual_dropout=0.0,
    )


def _vit(use_pooler):
    backbone = M.ViTBackbone(image_size=16, patch_size=8, num_layers=1, num_heads=2, hidden_dim=8,
                             intermediate_dim=16, use_pooler=use_pooler)
    return M.ViTImageClassifier(backbone, num_classes=3)


def _images():
    return {"images": rng.normal(size=(4, 16, 16, 3)).astype("float32")}


MASK_POSITIONS = np.tile(np.array([1, 4], "int32"), (4, 1))

# name -> () -> (task, inputs); the tasks of `tiny_models.task_cases` come too.
CASES = {
    "bert_text_embedder": lambda: (M.BertTextEmbedder(tiny_bert()), text_features(4, 12)),
    "bert_text_embedder_cls": lambda: (M.BertTextEmbedder(tiny_bert(), pooling="cls"), text_features(4, 12)),
    "vit_classifier_on_a_pooler": lambda: (_vit(use_pooler=True), _images()),
    "transformer_xl_lm": lambda: (
        M.TransformerXLCausalLM(M.TransformerXLBackbone(
            vocabulary_size=30, num_layers=1, num_heads=2, hidden_dim=8, head_dim=4, intermediate_dim=16,
            mem_len=4, cutoffs=[10, 20], div_val=2, dropout=0.0)),
        {"token_ids": random_ids(4, 5)}),
    "reformer_causal_lm": lambda: (
        M.ReformerCausalLM(tiny_reformer(hash_seed=0)),
        {"token_ids": random_ids(4, 8), "padding_mask": np.ones((4, 8), "int32")}),
    # Bidirectional: on a causal backbone the first position, which the
    # head reads, attends to itself alone, so no query weight has a gradient.
    "reformer_classifier": lambda: (
        M.ReformerTextClassifier(M.ReformerBackbone.from_config(
            {**tiny_reformer(hash_seed=0).get_config(), "is_causal": False}), num_classes=2),
        {"token_ids": random_ids(4, 8), "padding_mask": np.ones((4, 8), "int32")}),
    "vilbert_pretrainer": lambda: (
        M.ViLBERTPretrainer(_vilbert(), num_region_classes=7),
        {**vilbert_features(4), "mask_positions": np.ones((4, 1), "int32")}),
    "vilbert_retriever": lambda: (
        M.ViLBERTImageTextRetriever(_vilbert()), {k: v[:, None] for k, v in vilbert_features(4).items()}),
    "vilbert_region_scorer": lambda: (M.ViLBERTRegionScorer(_vilbert()), vilbert_features(4)),
    "vilbert_region_scorer_last_layer_co_attended": lambda: (
        M.ViLBERTRegionScorer(_vilbert(text_layers=(1, 2))), vilbert_features(4)),
    "vilbert_region_scorer_with_task_tokens": lambda: (
        M.ViLBERTRegionScorer(_vilbert(num_task_tokens=2)),
        {**vilbert_features(4), "task_ids": np.ones((4, 1), "int32")}),
}
for _name, _build in task_cases().items():
    if not _name.endswith("_backbone"):
        CASES.setdefault(_name, _build)


def _weight_gradients(model, x):
    """`{path: gradient or None}` of `sum(outputs · R)` (R fixed random
    arrays) with respect to each trainable weight of `model`'s layers (its
    own `trainable_weights` aside), by the backend's autodiff, at inference."""
    weights = [weight for weight in model.weights if weight.trainable]

    def objective(values):
        with keras.StatelessScope(state_mapping=list(zip(weights, values))):
            outputs = keras.tree.flatten(model(x, training=False))
        total = 0.0
        for index, output in enumerate(outputs):
            projection = np.random.default_rng(index).standard_normal(tuple(output.shape)).astype("float32")
            total += keras.ops.sum(keras.ops.cast(output, "float32") * keras.ops.convert_to_tensor(projection))
        return total

    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        gradients = jax.jit(jax.grad(objective))([weight.value for weight in weights])
    elif backend == "tensorflow":
        import tensorflow as tf

        values = [tf.identity(weight.value) for weight in weights]
        with tf.GradientTape() as tape:
            tape.watch(values)
            total = objective(values)
        gradients = tape.gradient(total, values)
    else:
        values = [weight.value.detach().clone().requires_grad_(True) for weight in weights]
        objective(values).backward()
        gradients = [value.grad for value in values]
    return {weight.path: gradient for weight, gradient in zip(weights, gradients)}


def _unused_paths(model):
    return sorted(weight.path for layer in model.unused_layers for weight in layer.weights)


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_unused_layers_hold_exactly_the_weights_without_a_gradient(case):
    model, x = CASES[case]()
    gradients = _weight_gradients(model, x)
    without_gradient = sorted(
        path for path, gradient in gradients.items()
        if gradient is None or not np.any(keras.ops.convert_to_numpy(gradient))
    )
    assert without_gradient == _unused_paths(model)
    assert {weight.path for weight in model.trainable_weights}.isdisjoint(without_gradient)
    assert len(model.trainable_weights) + len(model.non_trainable_weights) == len(model.weights)


def test_the_tasks_that_read_part_of_their_backbone_find_the_layers_of_the_rest():
    assert [layer.name for layer in M.BertMaskedLM(tiny_bert()).unused_layers] == ["pooler"]
    assert [layer.name for layer in _vit(use_pooler=True).unused_layers] == ["pooler"]
    assert _vit(use_pooler=False).unused_layers == ()
    scorer = M.ViLBERTRegionScorer(_vilbert())
    names = {layer.name for layer in scorer.unused_layers}
    assert {"transformer_layer_1", "pooler", "visual_pooler", "text_cross_attention", "text_feed_forward"} <= names
    assert not {"co_attention_layer_0", "co_attention_layer_1", "visual_cross_attention", "visual_feed_forward",
                "visual_transformer_layer_0"} & names


# name -> () -> (task, inputs, labels): the tasks with unused layers.
STEP_CASES = {
    "bert_masked_lm": lambda: (
        M.BertMaskedLM(tiny_bert()), {**text_features(4, 12), "mask_positions": MASK_POSITIONS}, random_ids(4, 2)),
    "bert_text_embedder": lambda: (M.BertTextEmbedder(tiny_bert()), text_features(4, 12), np.zeros((4, 8), "float32")),
    "vit_classifier_on_a_pooler": lambda: (_vit(use_pooler=True), _images(), np.array([0, 1, 2, 0])),
    "vilbert_region_scorer": lambda: (
        M.ViLBERTRegionScorer(_vilbert()), vilbert_features(4), np.tile(np.array([0.5, 0.5, 0.0], "float32"), (4, 1))),
}


@pytest.mark.parametrize("case", sorted(STEP_CASES))
def test_fit_with_weight_decay_leaves_the_unused_weights_as_they_were(case):
    model, x, y = STEP_CASES[case]()
    loss = "mse" if case == "bert_text_embedder" else "auto"
    model.compile(optimizer=keras.optimizers.AdamW(1e-2, weight_decay=0.5), loss=loss, metrics=[],
                  weighted_metrics=[])
    before = weights_of(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(x, y, batch_size=4, epochs=2, verbose=0)
    after = weights_of(model)
    unused = _unused_paths(model)
    assert unused
    assert [path for path in unused if not np.array_equal(before[path], after[path])] == []
    assert [path for path in before if path not in unused and np.array_equal(before[path], after[path])] == []
    assert not [w for w in caught if "Gradients do not exist" in str(w.message)]
    assert set(unused) <= {weight.path for weight in model.backbone.trainable_weights}


def test_a_classifier_on_the_masked_lm_s_backbone_trains_the_pooler():
    mlm = M.BertMaskedLM(tiny_bert())
    classifier = M.BertTextClassifier(mlm.backbone, num_classes=3, dropout=0.0)
    assert "pooler/kernel" in {weight.path for weight in classifier.trainable_weights}
    assert "pooler/kernel" not in {weight.path for weight in mlm.trainable_weights}
    before = keras.ops.convert_to_numpy(mlm.backbone.get_layer("pooler").kernel)
    classifier.compile(optimizer=keras.optimizers.Adam(1e-2))
    classifier.fit(text_features(4, 12), np.array([0, 1, 2, 0]), batch_size=4, verbose=0)
    assert not np.array_equal(before, keras.ops.convert_to_numpy(mlm.backbone.get_layer("pooler").kernel))


def test_a_frozen_backbone_counts_each_weight_once():
    mlm = M.BertMaskedLM(tiny_bert())
    mlm.backbone.trainable = False
    paths = [weight.path for weight in mlm.non_trainable_weights]
    assert len(paths) == len(set(paths)) == len(mlm.backbone.weights)
    assert "pooler/kernel" in paths


def test_an_unknown_backbone_output_is_named():
    with pytest.raises(ValueError, match=r"no output \['pooled'\].*sequence_output, pooled_output"):
        tiny_bert().unused_layers(["pooled"])
