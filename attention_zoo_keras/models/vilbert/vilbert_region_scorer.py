"""ViLBERT for referring expressions (Lu et al., 2019, §3.2 "Grounding
Referring Expressions"; RefCOCO, RefCOCO+, RefCOCOg), as the authors
fine-tune it (facebookresearch/vilbert-multi-task, `VILBertForVLTasks`,
the head `vision_logit`, task type `V-logit`).

Every region's final visual state `V_j` gets one matching score with the
expression,

    z_j = w · Dropout(V_j) + b − 10000 · (1 − m_j)        m_j: the region mask

so padded regions never win. Training targets are soft: the IoU of each
region with the ground-truth box where it exceeds 0.5, else 0; the loss is
sigmoid binary cross-entropy summed over the regions and averaged over the
batch (`SummedBinaryCrossentropy`); a prediction is right when the
top-scoring region's target exceeds 0.5.
"""

import keras
from keras import ops

from attention_zoo_keras.layers.classification_head import classification_head
from attention_zoo_keras.models.input_validation import check_soft_targets
from attention_zoo_keras.models.task import Task
from attention_zoo_keras.models.vilbert.vilbert_backbone import ViLBERTBackbone
from attention_zoo_keras.models.vilbert.vilbert_losses import SummedBinaryCrossentropy
from attention_zoo_keras.models.vilbert.vilbert_preprocessor import ViLBERTPreprocessor
from attention_zoo_keras.optimizers.fused_adam import FusedAdamW
from attention_zoo_keras.registration import register

# The additive mask the authors put on padded regions' logits.
PADDED_REGION_LOGIT = -10000.0
# A region is "the one referred to" when its target (IoU) exceeds this.
HIT_THRESHOLD = 0.5


class MaskPaddedRegions(keras.layers.Layer):
    """Region scores `(batch, regions, 1)` → `(batch, regions)`, with
    −10000 added where `region_mask` is 0 (the authors' additive mask)."""

    def call(self, scores, region_mask):
        scores = ops.squeeze(scores, axis=-1)
        padding = 1.0 - ops.cast(region_mask, scores.dtype)
        return scores + ops.cast(PADDED_REGION_LOGIT, scores.dtype) * padding

    def compute_output_shape(self, scores_shape, region_mask_shape):
        return tuple(scores_shape[:-1])


@keras.saving.register_keras_serializable(package="attention_zoo_keras")
def region_hit(y_true, y_pred):
    """1 where the top-scoring region's target exceeds 0.5 (the authors'
    referring-expression accuracy), per example."""
    best = ops.expand_dims(ops.argmax(y_pred, axis=-1), -1)
    target = ops.squeeze(ops.take_along_axis(ops.cast(y_true, "float32"), best, axis=-1), -1)
    return ops.cast(target > HIT_THRESHOLD, "float32")


@register
class ViLBERTRegionScorer(Task):
    """Scores every image region against a referring expression ("the man
    on the left"): which region does the text describe?

    `Dense(1)` on each region's final visual state (after dropout), with
    −10000 on padded regions (Lu et al., 2019; the authors' `vision_logit`).

    Args:
        backbone: `ViLBERTBackbone`. The two-stream encoder.
        dropout: float. Dropout on the visual states (0.1, as the authors').
        preprocessor: `ViLBERTPreprocessor` or None. Raw texts and detector
            regions in; region 0 is the global image region.

    Inputs: the backbone's feature dict. Output: region logits `(batch,
    regions)`; `argmax` picks the region referred to.

    `compile()` defaults to AdamW (4e-5) and `SummedBinaryCrossentropy`
    (sigmoid cross-entropy summed over regions) on soft targets `(batch,
    regions)` in [0, 1] (the region's IoU with the referred box where above
    0.5, else 0), with the authors' accuracy (`region_hit`).

    Example:

    >>> import numpy as np
    >>> backbone = ViLBERTBackbone(
    ...     vocabulary_size=50, num_layers=2, num_heads=2, hidden_dim=8, intermediate_dim=16,
    ...     region_feature_dim=6, visual_num_layers=2, visual_num_heads=2, visual_hidden_dim=4,
    ...     visual_intermediate_dim=8, co_attention_dim=4, co_attention_num_heads=2,
    ...     co_attention_text_layers=[1, 2], co_attention_visual_layers=[0, 1],
    ...     max_sequence_length=8)
    >>> scorer = ViLBERTRegionScorer(backbone)
    >>> ids = np.array([[2, 15, 27, 3, 0]])
    >>> logits = scorer.predict({"token_ids": ids, "segment_ids": np.zeros_like(ids),
    ...                          "padding_mask": (ids > 0).astype("int32"),
    ...                          "region_features": np.ones((1, 3, 6), "float32"),
    ...                          "region_boxes": np.tile(np.array([0, 0, 1, 1, 1], "float32"), (1, 3, 1)),
    ...                          "region_mask": np.array([[1, 1, 0]], "int32")}, verbose=0)
    >>> logits.shape, bool(logits[0, 2] < -9000)
    ((1, 3), True)
    """

    backbone_cls = ViLBERTBackbone
    backbone_outputs = ("visual_sequence_output",)
    preprocessor_cls = ViLBERTPreprocessor

    def __init__(self, backbone, dropout=0.1, preprocessor=None, **kwargs):
        initializer = keras.initializers.TruncatedNormal(stddev=backbone.initializer_range)
        dtype = backbone.dtype_policy
        inputs = backbone.input
        scores = classification_head(
            backbone(inputs)["visual_sequence_output"], 1, dropout, initializer, dtype=dtype, name="region",
            output_name="region_score",
        )
        logits = MaskPaddedRegions(dtype=dtype, name="region_logits")(scores, inputs["region_mask"])
        super().__init__(inputs=inputs, outputs=logits, backbone=backbone, preprocessor=preprocessor, **kwargs)
        self.dropout = dropout

    def validate_labels(self, labels, inputs=None):
        """Labels are soft scores in [0, 1], one per region slot of the batch."""
        check_soft_targets(labels, None if inputs is None else inputs["region_mask"].shape[-1])

    def default_compile_arguments(self):
        return {
            "optimizer": FusedAdamW(4e-5, weight_decay=0.01),
            "loss": SummedBinaryCrossentropy(),
            "metrics": [keras.metrics.MeanMetricWrapper(region_hit, name="accuracy")],
        }

    def get_config(self):
        config = super().get_config()
        config["dropout"] = self.dropout
        return config

