"""The Reformer encoder (Kitaev et al., 2020, "Reformer: The Efficient
Transformer", ICLR 2020) for sequence classification: the first position's
`2·d`-wide output through a small two-layer head,

    h = [Y1 ; Y2]_normed[:, 0]                           (width 2·d)
    logits = Dropout(tanh(Dropout(h) W₁ + b₁)) W₂ + b₂   (W₁: 2·d × d, W₂: d × classes)

As `transformers`' `ReformerForSequenceClassification`
(`ReformerClassificationHead`), whose checkpoints convert unchanged:
`classifier.dense` → `classifier_dense`, `classifier.out_proj` →
`classifier_out_proj`, and its dropout is `classifier_dropout`, else
`hidden_dropout_prob` (the backbone's `dropout`).
"""

import logging

import keras

from attention_zoo_keras.layers.fused_keras_layers import Dense
from attention_zoo_keras.losses.class_cross_entropy import ClassCrossentropy
from attention_zoo_keras.metrics.class_accuracy import ClassAccuracy
from attention_zoo_keras.models.input_validation import check_class_labels
from attention_zoo_keras.models.reformer.reformer_backbone import ReformerBackbone
from attention_zoo_keras.models.reformer.reformer_preprocessor import ReformerPreprocessor
from attention_zoo_keras.models.task import Task
from attention_zoo_keras.optimizers.fused_adam import FusedAdam
from attention_zoo_keras.registration import register

logger = logging.getLogger(__name__)


@register
class ReformerTextClassifier(Task):
    """Classifies a text into `num_classes` classes from its first position.

    Args:
        backbone: `ReformerBackbone`. Bidirectional (`is_causal=False`) to be
            of use: with a causal one the first position sees only the first
            token (allowed, as in `transformers`, with a warning).
        num_classes: int. The number of classes.
        preprocessor: `ReformerPreprocessor` or None. So `fit`/`predict` take
            raw strings.
        dropout: float or None. Dropout before each of the head's two dense
            layers; `None` (the default) takes the backbone's `dropout`, as
            `transformers` takes `hidden_dropout_prob` when
            `classifier_dropout` is unset.

    Inputs: the backbone's `token_ids` and `padding_mask` `(batch, length)`.
    Output: logits `(batch, num_classes)`. `compile()` defaults to Adam
    (1e-4), cross-entropy on logits and accuracy, with labels as class
    indices or rows of class probabilities (one-hot, soft:
    `losses.ClassCrossentropy`).

    Training needs sequences whose length is a multiple of the chunk
    lengths (and, with axial positions, exactly `n₁·n₂` long).

    Example:

    >>> import numpy as np
    >>> backbone = ReformerBackbone(vocabulary_size=32, hidden_dim=8, num_heads=2, head_dim=4, intermediate_dim=16,
    ...                             attention=["local", "lsh"], is_causal=False, attention_options={
    ...                                 "lsh": {"num_buckets": 4, "chunk_length": 4, "num_chunks_after": 1},
    ...                                 "local": {"block_size": 4, "num_memory_blocks_after": 1}},
    ...                             axial_pos_shape=(4, 4), axial_pos_embds_dim=(4, 4))
    >>> classifier = ReformerTextClassifier(backbone, num_classes=3)
    >>> ids = np.array([[5, 6, 7, 8, 9, 10, 11, 12]])
    >>> tuple(classifier.predict({"token_ids": ids, "padding_mask": np.ones_like(ids)}, verbose=0).shape)
    (1, 3)
    """

    backbone_cls = ReformerBackbone
    preprocessor_cls = ReformerPreprocessor

    def __init__(self, backbone, num_classes, preprocessor=None, dropout=None, **kwargs):
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
            raise ValueError(f"num_classes must be a positive int; got {num_classes!r}.")
        if backbone.is_causal:
            logger.warning(
                "ReformerTextClassifier on a causal backbone (is_causal=True): the first position, which the head "
                "reads, sees only the first token. Use a bidirectional backbone (is_causal=False)."
            )
        dropout = backbone.dropout if dropout is None else dropout
        initializer_range = backbone.initializer_range
        dtype = backbone.dtype_policy
        inputs = dict(backbone.input)
        first = backbone(inputs)["sequence_output"][:, 0, :]
        x = keras.layers.Dropout(dropout, dtype=dtype, name="classifier_dropout")(first)
        x = Dense(
            backbone.hidden_dim,
            activation="tanh",
            kernel_initializer=keras.initializers.RandomNormal(stddev=initializer_range),
            dtype=dtype,
            name="classifier_dense",
        )(x)
        x = keras.layers.Dropout(dropout, dtype=dtype, name="classifier_hidden_dropout")(x)
        logits = Dense(
            num_classes,
            kernel_initializer=keras.initializers.RandomNormal(stddev=initializer_range),
            dtype=dtype,
            name="classifier_out_proj",
        )(x)
        super().__init__(inputs=inputs, outputs=logits, backbone=backbone, preprocessor=preprocessor, **kwargs)
        self.num_classes = num_classes
        self.dropout = dropout

    def validate_labels(self, labels, inputs=None):
        """Labels are class indices in `[0, num_classes)`, or one-hot rows `num_classes` wide."""
        check_class_labels(labels, self.num_classes)

    def default_compile_arguments(self):
        return {
            "optimizer": FusedAdam(1e-4),
            "loss": ClassCrossentropy(),
            "metrics": [ClassAccuracy()],
        }

    def get_config(self):
        config = super().get_config()
        config.update({"num_classes": self.num_classes, "dropout": self.dropout})
        return config
