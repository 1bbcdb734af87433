"""ViLBERT's pretraining on image-caption pairs (Lu et al., 2019, §3.2
"Training Tasks and Objectives"), as the authors train it on Conceptual
Captions (facebookresearch/vilbert-multi-task, `BertForMultiModalPreTraining`
with `visual_target=0`, `train_concap.py`).

Three heads read the two-stream encoder:

    masked words     p(w | T_i) = softmax(LayerNorm(act(W_t T_i + b_t)) Eᵀ + b)    E: token embeddings
    masked regions   q(c | V_j) = softmax(W_c LayerNorm(act(W_r V_j + b_r)) + b_c)  over the detector's classes
    alignment        a = softmax(W_a Dropout(h_T ⊙ h_V) + b_a)                      0 aligned, 1 not

and the loss is their sum,

    L = mean_{masked words} −log p(w)
      + mean_{masked regions} KL(d_j ‖ q_j)      d_j: the detector's class distribution of region j
      + mean_{pairs} −log a(label)

About 15 % of the words are masked as in BERT, about 15 % of the regions
have their features zeroed (90 % of them) and must predict what the detector
saw there, and half of the captions are replaced by another image's: the
alignment head says whether caption and image belong together. The region
head's transform uses the text activation (`hidden_act`), as the authors'
`BertImgPredictionHeadTransform` does.
"""

import keras
import numpy as np

from attention_zoo_keras.layers.activations import get_activation
from attention_zoo_keras.layers.classification_head import classification_head
from attention_zoo_keras.layers.fused_keras_layers import Dense
from attention_zoo_keras.layers.fused_keras_layers import LayerNormalization
from attention_zoo_keras.layers.initializers import clone_initializer
from attention_zoo_keras.layers.masked_lm_head import MaskedLMHead
from attention_zoo_keras.losses.token_cross_entropy import token_cross_entropy
from attention_zoo_keras.models.input_validation import check_class_labels
from attention_zoo_keras.models.input_validation import check_id_range
from attention_zoo_keras.models.input_validation import check_soft_targets
from attention_zoo_keras.models.task import Task
from attention_zoo_keras.models.vilbert.vilbert_backbone import ViLBERTBackbone
from attention_zoo_keras.models.vilbert.vilbert_fusion import fuse_pooled_outputs
from attention_zoo_keras.models.vilbert.vilbert_losses import ViLBERTRegionKLDivergence
from attention_zoo_keras.models.vilbert.vilbert_pretrainer_preprocessor import ViLBERTPretrainerPreprocessor
from attention_zoo_keras.optimizers.fused_adam import FusedAdamW
from attention_zoo_keras.registration import register

# The Visual Genome classes of the authors' Faster R-CNN (1600 + background).
DETECTOR_NUM_CLASSES = 1601
# The authors' heads normalise with BertLayerNorm(eps=1e-12).
HEAD_LAYER_NORM_EPSILON = 1e-12


@register
class ViLBERTPretrainer(Task):
    """ViLBERT with its three pretraining heads: masked words, masked regions
    (against the detector's class distribution), image-text alignment.

    Args:
        backbone: `ViLBERTBackbone`. The two-stream encoder.
        num_region_classes: int. The classes of the detector whose
            distributions the masked regions predict (1601 for the authors'
            Visual Genome Faster R-CNN: `v_target_size`).
        fusion: str. How the alignment head joins the pooled outputs,
            `"mul"` (the authors' default) or `"sum"`.
        dropout: float. Dropout on the fused vector (0.1, as the authors').
        preprocessor: `ViLBERTPretrainerPreprocessor` or None. Masks raw
            captions and regions and draws mismatched captions for `fit`.

    Inputs: the backbone's feature dict plus `mask_positions` `(batch, P)`,
    the text positions to predict. Outputs: a dict of `token_logits`
    `(batch, P, vocabulary_size)`, `region_logits` `(batch, regions,
    num_region_classes)` for every region, and `alignment_logits`
    `(batch, 2)` (class 0: the caption describes the image).

    Targets for `fit`: `{"token_logits": original ids (batch, P),
    "region_logits": detector class distributions (batch, regions, classes),
    "alignment_logits": 0/1 (batch,)}` with sample weights `{"token_logits":
    1 on real predictions, "region_logits": 1 on masked regions,
    "alignment_logits": 1}`, which the preprocessor produces.

    `compile()` defaults to AdamW (1e-4, the authors' pretraining rate) and
    the authors' objective: cross-entropy averaged over the masked words, the
    region KL divergence averaged over the masked regions
    (`ViLBERTRegionKLDivergence`), and cross-entropy on alignment, summed.

    Example:

    >>> import numpy as np
    >>> backbone = ViLBERTBackbone(
    ...     vocabulary_size=50, num_layers=2, num_heads=2, hidden_dim=8, intermediate_dim=16,
    ...     region_feature_dim=6, visual_num_layers=2, visual_num_heads=2, visual_hidden_dim=4,
    ...     visual_intermediate_dim=8, co_attention_dim=4, co_attention_num_heads=2,
    ...     co_attention_text_layers=[1, 2], co_attention_visual_layers=[0, 1],
    ...     max_sequence_length=8)
    >>> pretrainer = ViLBERTPretrainer(backbone, num_region_classes=7)
    >>> ids = np.array([[2, 15, 4, 3, 0]])
    >>> out = pretrainer.predict({"token_ids": ids, "segment_ids": np.zeros_like(ids),
    ...                           "padding_mask": (ids > 0).astype("int32"),
    ...                           "mask_positions": np.array([[2]]),
    ...                           "region_features": np.ones((1, 3, 6), "float32"),
    ...                           "region_boxes": np.tile(np.array([0, 0, 1, 1, 1], "float32"), (1, 3, 1)),
    ...                           "region_mask": np.ones((1, 3), "int32")}, verbose=0)
    >>> {name: value.shape for name, value in sorted(out.items())}
    {'alignment_logits': (1, 2), 'region_logits': (1, 3, 7), 'token_logits': (1, 1, 50)}
    """

    backbone_cls = ViLBERTBackbone
    preprocessor_cls = ViLBERTPretrainerPreprocessor

    def __init__(
        self,
        backbone,
        num_region_classes=DETECTOR_NUM_CLASSES,
        fusion="mul",
        dropout=0.1,
        preprocessor=None,
        **kwargs,
    ):
        if not isinstance(num_region_classes, int) or num_region_classes < 1:
            raise ValueError(f"num_region_classes must be a positive int; got {num_region_classes!r}.")
        if backbone.num_task_tokens:
            raise ValueError(
                "ViLBERTPretrainer takes a backbone without task tokens (num_task_tokens=0): the authors "
                "pretrain without them, and the inserted token would shift every mask position."
            )
        initializer = keras.initializers.TruncatedNormal(stddev=backbone.initializer_range)
        dtype = backbone.dtype_policy

        # === Layers ===
        token_head = MaskedLMHead(
            backbone.token_embedding,
            activation=backbone.activation,
            layer_norm_epsilon=HEAD_LAYER_NORM_EPSILON,
            kernel_initializer=clone_initializer(initializer),
            dtype=dtype,
            name="mlm_head",
        )
        region_transform = Dense(
            backbone.visual_hidden_dim, activation=get_activation(backbone.activation),
            kernel_initializer=clone_initializer(initializer), dtype=dtype, name="region_head_transform",
        )
        region_norm = LayerNormalization(epsilon=HEAD_LAYER_NORM_EPSILON, dtype=dtype, name="region_head_norm")
        region_output = Dense(
            num_region_classes, kernel_initializer=clone_initializer(initializer), dtype=dtype,
            name="region_logits",
        )

        # === Functional Model ===
        inputs = dict(backbone.input)
        inputs["mask_positions"] = keras.Input(shape=(None,), dtype="int32", name="mask_positions")
        outputs = backbone({name: value for name, value in inputs.items() if name != "mask_positions"})
        token_logits = token_head(outputs["sequence_output"], inputs["mask_positions"])
        region_logits = region_output(region_norm(region_transform(outputs["visual_sequence_output"])))
        alignment_logits = classification_head(
            fuse_pooled_outputs(outputs, fusion, dtype, name="alignment"), 2, dropout, initializer, dtype=dtype,
            name="alignment", output_name="alignment_logits",
        )
        super().__init__(
            inputs=inputs,
            outputs={
                "token_logits": token_logits,
                "region_logits": region_logits,
                "alignment_logits": alignment_logits,
            },
            backbone=backbone,
            preprocessor=preprocessor,
            **kwargs,
        )
        self.mlm_head = token_head

        # === Config ===
        self.num_region_classes = num_region_classes
        self.fusion = fusion
        self.dropout = dropout

    def validate_inputs(self, inputs):
        super().validate_inputs(inputs)
        if "mask_positions" in inputs:
            check_id_range("mask_positions", inputs["mask_positions"], np.shape(inputs["token_ids"])[-1])

    def validate_labels(self, labels, inputs=None):
        """Labels are a dict: the masked words' ids (`token_logits`), the
        detector's class distributions (`region_logits`) and whether each
        pair is aligned (`alignment_logits`, 0 aligned or 1 not)."""
        if not isinstance(labels, dict):
            return
        if "token_logits" in labels:
            check_id_range("labels['token_logits']", labels["token_logits"], self.backbone.vocabulary_size)
        if "region_logits" in labels:
            check_soft_targets(labels["region_logits"], self.num_region_classes)
        if "alignment_logits" in labels:
            check_class_labels(labels["alignment_logits"], 2)

    def default_compile_arguments(self):
        return {
            "optimizer": FusedAdamW(1e-4, weight_decay=0.01),
            "loss": {
                "token_logits": token_cross_entropy(),
                "region_logits": ViLBERTRegionKLDivergence(),
                "alignment_logits": keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            },
            "weighted_metrics": {
                "token_logits": [keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
                "alignment_logits": [keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
            },
        }

    def get_config(self):
        config = super().get_config()
        config.update(
            {"num_region_classes": self.num_region_classes, "fusion": self.fusion, "dropout": self.dropout}
        )
        return config

