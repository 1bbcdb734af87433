"""BERT with its masked-language-model head, for (continued) pretraining."""

import keras
import numpy as np

from attention_zoo_keras.layers.masked_lm_head import MaskedLMHead
from attention_zoo_keras.losses.token_cross_entropy import token_cross_entropy
from attention_zoo_keras.models.bert.bert_backbone import BertBackbone
from attention_zoo_keras.models.bert.bert_masked_lm_preprocessor import BertMaskedLMPreprocessor
from attention_zoo_keras.models.input_validation import check_id_range
from attention_zoo_keras.models.task import Task
from attention_zoo_keras.optimizers.fused_adam import FusedAdamW
from attention_zoo_keras.registration import register


@register
class BertMaskedLM(Task):
    """Predicts the original tokens at masked positions.

    Args:
        backbone: `BertBackbone`. The encoder.
        preprocessor: `BertMaskedLMPreprocessor` or None. Masks raw text for
            `fit`.

    Inputs: the backbone's features plus `mask_positions` `(batch, P)`.
    Output: logits `(batch, P, vocabulary_size)`.

    Example:

    >>> mlm = BertMaskedLM.from_preset("bert_base")              # doctest: +SKIP
    >>> mlm.fit(["unlabelled text ...", "more text ..."], epochs=1) # doctest: +SKIP
    """

    backbone_cls = BertBackbone
    backbone_outputs = ("sequence_output",)
    preprocessor_cls = BertMaskedLMPreprocessor

    def __init__(self, backbone, preprocessor=None, **kwargs):
        inputs = dict(backbone.input)
        inputs["mask_positions"] = keras.Input(shape=(None,), dtype="int32", name="mask_positions")
        head = MaskedLMHead(
            backbone.token_embedding,
            activation=backbone.activation,
            layer_norm_epsilon=backbone.layer_norm_epsilon,
            kernel_initializer=keras.initializers.TruncatedNormal(stddev=backbone.initializer_range),
            dtype=backbone.dtype_policy,
            name="mlm_head",
        )
        sequence_output = backbone({k: v for k, v in inputs.items() if k != "mask_positions"})["sequence_output"]
        logits = head(sequence_output, inputs["mask_positions"])
        super().__init__(inputs=inputs, outputs=logits, backbone=backbone, preprocessor=preprocessor, **kwargs)
        self.mlm_head = head

    def validate_inputs(self, inputs):
        super().validate_inputs(inputs)
        if "mask_positions" in inputs:
            check_id_range("mask_positions", inputs["mask_positions"], np.shape(inputs["token_ids"])[-1])

    def validate_labels(self, labels, inputs=None):
        """Labels are the masked tokens' ids, in the vocabulary."""
        check_id_range("labels", labels, self.backbone.vocabulary_size)

    def default_compile_arguments(self):
        return {
            "optimizer": FusedAdamW(5e-5, weight_decay=0.01),
            "loss": token_cross_entropy(),
            "weighted_metrics": [keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
        }
