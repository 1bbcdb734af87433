"""BERT for sequence classification (Devlin et al., 2019, §4.1): a linear
layer on the pooled `[CLS]` representation."""

import keras

from attention_zoo_keras.layers.classification_head import classification_head
from attention_zoo_keras.losses.class_cross_entropy import ClassCrossentropy
from attention_zoo_keras.metrics.class_accuracy import ClassAccuracy
from attention_zoo_keras.models.bert.bert_backbone import BertBackbone
from attention_zoo_keras.models.bert.bert_preprocessor import BertPreprocessor
from attention_zoo_keras.models.input_validation import check_class_labels
from attention_zoo_keras.models.task import Task
from attention_zoo_keras.optimizers.fused_adam import FusedAdamW
from attention_zoo_keras.registration import register


@register
class BertTextClassifier(Task):
    """Classifies a text (or a text pair) into `num_classes` classes.

    Args:
        backbone: `BertBackbone`. The encoder.
        num_classes: int. The number of classes.
        preprocessor: `BertPreprocessor` or None. So `fit`/`predict` take raw
            strings.
        dropout: float. Dropout before the classifier, BERT's
            `hidden_dropout_prob`.

    Output: logits `(batch, num_classes)`. `compile()` defaults to AdamW
    (5e-5), cross-entropy on logits and accuracy, with labels as class
    indices or rows of class probabilities (one-hot, soft:
    `losses.ClassCrossentropy`).

    Example:

    >>> clf = BertTextClassifier.from_preset("bert_base", num_classes=2)  # doctest: +SKIP
    >>> clf.fit(["a great film", "dull and long"], [1, 0], epochs=1)      # doctest: +SKIP
    >>> clf.predict(["what a film"]).argmax(-1)                           # doctest: +SKIP
    """

    backbone_cls = BertBackbone
    preprocessor_cls = BertPreprocessor

    def __init__(self, backbone, num_classes, preprocessor=None, dropout=0.1, **kwargs):
        if not isinstance(num_classes, int) or num_classes < 1:
            raise ValueError(f"num_classes must be a positive int; got {num_classes!r}.")
        inputs = backbone.input
        logits = classification_head(
            backbone(inputs)["pooled_output"],
            num_classes,
            dropout,
            keras.initializers.TruncatedNormal(stddev=backbone.initializer_range),
            dtype=backbone.dtype_policy,
        )
        super().__init__(inputs=inputs, outputs=logits, backbone=backbone, preprocessor=preprocessor, **kwargs)
        self.num_classes = num_classes
        self.dropout = dropout

    def validate_labels(self, labels, inputs=None):
        """Labels are class indices in `[0, num_classes)`, or one-hot rows `num_classes` wide."""
        check_class_labels(labels, self.num_classes)

    def default_compile_arguments(self):
        return {
            "optimizer": FusedAdamW(5e-5, weight_decay=0.01),
            "loss": ClassCrossentropy(),
            "metrics": [ClassAccuracy()],
        }

    def get_config(self):
        config = super().get_config()
        config.update({"num_classes": self.num_classes, "dropout": self.dropout})
        return config
