"""ViLBERT for visual question answering (Lu et al., 2019, "ViLBERT:
Pretraining Task-Agnostic Visiolinguistic Representations for
Vision-and-Language Tasks", §3.2 "VQA"), as the authors fine-tune it
(facebookresearch/vilbert-multi-task, `VILBertForVLTasks`, the head
`vil_prediction`).

The two pooled outputs, text `h_T` and image `h_V` (each `co_attention_dim`
wide), are fused, then a two-layer MLP scores every answer:

    h = Dropout(h_T ⊙ h_V)          fusion "mul" (the authors' default)
    h = Dropout(h_T + h_V)          fusion "sum"
    u = LayerNorm(GELU(W_1 h + b_1))    W_1: (2·co_attention_dim) × co_attention_dim, eps 1e-12
    logits = W_2 u + b_2                one logit per answer (3129 for VQA v2)

VQA is trained as multi-label classification on soft answer scores
`s_a = min(1, #annotators who gave a / 3)`: binary cross-entropy on each
answer's logit, summed over the answers and averaged over the batch. The
authors compute `BCEWithLogitsLoss(reduction="mean")(logits, s) * num_answers`,
which is that same sum (`SummedBinaryCrossentropy`).
"""

import keras
from keras import ops

from attention_zoo_keras.layers.classification_head import classification_head
from attention_zoo_keras.models.input_validation import check_soft_targets
from attention_zoo_keras.models.task import Task
from attention_zoo_keras.models.vilbert.vilbert_backbone import ViLBERTBackbone
from attention_zoo_keras.models.vilbert.vilbert_fusion import fuse_pooled_outputs
from attention_zoo_keras.models.vilbert.vilbert_losses import SummedBinaryCrossentropy
from attention_zoo_keras.models.vilbert.vilbert_preprocessor import ViLBERTPreprocessor
from attention_zoo_keras.optimizers.fused_adam import FusedAdamW
from attention_zoo_keras.registration import register

VQA_NUM_ANSWERS = 3129
# The authors' SimpleClassifier normalises with BertLayerNorm(eps=1e-12).
HEAD_LAYER_NORM_EPSILON = 1e-12


@keras.saving.register_keras_serializable(package="attention_zoo_keras")
def vqa_score(y_true, y_pred):
    """The VQA accuracy of the top answer: its soft score (the authors'
    `compute_score_with_logits`, per example)."""
    best = ops.expand_dims(ops.argmax(y_pred, axis=-1), -1)
    return ops.squeeze(ops.take_along_axis(ops.cast(y_true, "float32"), best, axis=-1), -1)


@register
class ViLBERTVisualQuestionAnswerer(Task):
    """Answers a question about an image by scoring `num_answers` answers.

    The pooled text and image outputs of a `ViLBERTBackbone` are fused
    (elementwise product, `"mul"`, or sum, `"sum"`), dropped out, and scored
    by `Dense(2·d) → GELU → LayerNorm(eps 1e-12) → Dense(num_answers)`
    (`d = co_attention_dim`), the authors' `SimpleClassifier` (Lu et al.,
    2019; facebookresearch/vilbert-multi-task `VILBertForVLTasks`).

    Args:
        backbone: `ViLBERTBackbone`. The two-stream encoder.
        num_answers: int. The answer vocabulary size (3129 for VQA v2).
        fusion: str. `"mul"` (the authors' `fusion_method` default) or
            `"sum"`.
        dropout: float. Dropout on the fused vector (the authors'
            `dropout_prob`, 0.1).
        hidden_dim: int or None. The head's hidden width; `None`:
            `2 * co_attention_dim`.
        preprocessor: `ViLBERTPreprocessor` or None. Raw questions and
            detector regions in.

    Inputs: the backbone's feature dict (`token_ids`, `segment_ids`,
    `padding_mask`, `region_features`, `region_boxes`, `region_mask`).
    Output: answer logits `(batch, num_answers)`.

    `compile()` defaults to AdamW (4e-5, the authors' VQA learning rate),
    `SummedBinaryCrossentropy` (sigmoid binary cross-entropy on soft answer scores,
    summed over answers: `BinaryCrossentropy(from_logits=True)` × num_answers)
    and the VQA score of the top answer (`vqa_score`). Targets are soft
    scores `(batch, num_answers)` in [0, 1].

    Example:

    >>> import numpy as np
    >>> backbone = ViLBERTBackbone(
    ...     vocabulary_size=50, num_layers=2, num_heads=2, hidden_dim=8, intermediate_dim=16,
    ...     region_feature_dim=6, visual_num_layers=2, visual_num_heads=2, visual_hidden_dim=4,
    ...     visual_intermediate_dim=8, co_attention_dim=4, co_attention_num_heads=2,
    ...     co_attention_text_layers=[1, 2], co_attention_visual_layers=[0, 1],
    ...     max_sequence_length=8)
    >>> vqa = ViLBERTVisualQuestionAnswerer(backbone, num_answers=10)
    >>> ids = np.array([[2, 15, 27, 3, 0]])
    >>> logits = vqa.predict({"token_ids": ids, "segment_ids": np.zeros_like(ids),
    ...                       "padding_mask": (ids > 0).astype("int32"),
    ...                       "region_features": np.ones((1, 3, 6), "float32"),
    ...                       "region_boxes": np.tile(np.array([0, 0, 1, 1, 1], "float32"), (1, 3, 1)),
    ...                       "region_mask": np.ones((1, 3), "int32")}, verbose=0)
    >>> logits.shape
    (1, 10)
    """

    backbone_cls = ViLBERTBackbone
    preprocessor_cls = ViLBERTPreprocessor

    def __init__(
        self,
        backbone,
        num_answers=VQA_NUM_ANSWERS,
        fusion="mul",
        dropout=0.1,
        hidden_dim=None,
        preprocessor=None,
        **kwargs,
    ):
        if not isinstance(num_answers, int) or num_answers < 1:
            raise ValueError(f"num_answers must be a positive int; got {num_answers!r}.")
        if hidden_dim is None:
            hidden_dim = 2 * backbone.co_attention_dim
        initializer = keras.initializers.TruncatedNormal(stddev=backbone.initializer_range)
        dtype = backbone.dtype_policy

        # === Functional Model ===
        inputs = backbone.input
        logits = classification_head(
            fuse_pooled_outputs(backbone(inputs), fusion, dtype, name="vqa"),
            num_answers,
            dropout,
            initializer,
            dtype=dtype,
            name="vqa",
            output_name="vqa_logits",
            hidden_dim=hidden_dim,
            hidden_activation="gelu",
            layer_norm_epsilon=HEAD_LAYER_NORM_EPSILON,
        )
        super().__init__(inputs=inputs, outputs=logits, backbone=backbone, preprocessor=preprocessor, **kwargs)

        # === Config ===
        self.num_answers = num_answers
        self.fusion = fusion
        self.dropout = dropout
        self.hidden_dim = hidden_dim

    def validate_labels(self, labels, inputs=None):
        """Labels are soft answer scores in [0, 1], `num_answers` per question."""
        check_soft_targets(labels, self.num_answers)

    def default_compile_arguments(self):
        return {
            "optimizer": FusedAdamW(4e-5, weight_decay=0.01),
            "loss": SummedBinaryCrossentropy(),
            "metrics": [keras.metrics.MeanMetricWrapper(vqa_score, name="vqa_score")],
        }

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_answers": self.num_answers,
                "fusion": self.fusion,
                "dropout": self.dropout,
                "hidden_dim": self.hidden_dim,
            }
        )
        return config

