"""ViT for image classification (Dosovitskiy et al., 2021, "An Image is
Worth 16x16 Words", §3.1): a linear layer on the final-norm class token

    logits = W · LN(z_L)[0] + b

or, with `pooling="mean"`, on the mean of the patch tokens."""

import keras
import numpy as np
from keras import ops

from attention_zoo_keras.layers.classification_head import classification_head
from attention_zoo_keras.losses.class_cross_entropy import ClassCrossentropy
from attention_zoo_keras.metrics.class_accuracy import ClassAccuracy
from attention_zoo_keras.models.input_validation import check_class_labels
from attention_zoo_keras.models.task import Task
from attention_zoo_keras.models.vit.vit_backbone import ViTBackbone
from attention_zoo_keras.models.vit.vit_image_converter import ViTImageConverter
from attention_zoo_keras.optimizers.fused_adam import FusedAdamW
from attention_zoo_keras.registration import register

POOLINGS = ("token", "mean")


@register
class ViTImageClassifier(Task):
    """Classifies images into `num_classes` classes.

    Args:
        backbone: `ViTBackbone`. The encoder.
        num_classes: int. The number of classes.
        preprocessor: `ViTImageConverter` or None. So `fit` / `predict` take
            raw images (uint8 or 0–255 float arrays of any size, PIL images).
            Without it, and in the `*_on_batch` methods, the model takes
            normalized float images `(batch, height, width, channels)` at
            the backbone's size, bare or as `{"images": images}`.
        pooling: str. `"token"` (the class token, as ViT) or `"mean"` (the
            mean of the patch tokens).
        dropout: float. Dropout before the classifier.
        class_names: list of str or None. The names of the classes, one per
            class (a preset converted from `transformers` brings its
            `id2label`).

    Output: logits `(batch, num_classes)`. `compile()` defaults to AdamW
    (1e-4, weight decay 0.05), cross-entropy on logits and accuracy, with
    labels as class indices or rows of class probabilities (one-hot, soft:
    `losses.ClassCrossentropy`). `from_preset(..., image_size=384)` builds the backbone at a new
    resolution (position embeddings interpolated) and the converter to match.

    Example:

    >>> vit = ViTImageClassifier.from_preset("vit_base_patch16_224")   # doctest: +SKIP
    >>> vit.predict(images, top_k=3)   # [[("tabby, tabby cat", 0.71), ...], ...]  # doctest: +SKIP
    >>> clf = ViTImageClassifier.from_preset("vit_base_patch16_224", num_classes=10,
    ...                                      image_size=384)            # doctest: +SKIP
    >>> clf.fit(images, labels, epochs=3)                               # doctest: +SKIP
    """

    backbone_cls = ViTBackbone
    backbone_outputs = ("sequence_output",)
    preprocessor_cls = ViTImageConverter
    shared_preset_arguments = ("image_size",)

    def __init__(
        self, backbone, num_classes, preprocessor=None, pooling="token", dropout=0.0, class_names=None, **kwargs
    ):
        if not isinstance(num_classes, int) or num_classes < 1:
            raise ValueError(f"num_classes must be a positive int; got {num_classes!r}.")
        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}; got '{pooling}'.")
        if class_names is not None:
            class_names = [str(name) for name in class_names]
            if len(class_names) != num_classes:
                raise ValueError(f"Got {len(class_names)} class_names for {num_classes} classes.")
        if preprocessor is not None and tuple(preprocessor.image_size) != tuple(backbone.image_size):
            raise ValueError(
                f"The preprocessor resizes to {tuple(preprocessor.image_size)} but the backbone "
                f"takes {tuple(backbone.image_size)} images."
            )
        inputs = backbone.input
        sequence = backbone(inputs)["sequence_output"]
        pooled = sequence[:, 0, :] if pooling == "token" else ops.mean(sequence[:, 1:, :], axis=1)
        logits = classification_head(
            pooled,
            num_classes,
            dropout,
            keras.initializers.TruncatedNormal(stddev=backbone.initializer_range),
            dtype=backbone.dtype_policy,
        )
        super().__init__(inputs=inputs, outputs=logits, backbone=backbone, preprocessor=preprocessor, **kwargs)
        self.num_classes = num_classes
        self.pooling = pooling
        self.dropout = dropout
        self.class_names = class_names

    def validate_labels(self, labels, inputs=None):
        """Labels are class indices in `[0, num_classes)`, or one-hot rows `num_classes` wide."""
        check_class_labels(labels, self.num_classes)

    def default_compile_arguments(self):
        return {
            "optimizer": FusedAdamW(1e-4, weight_decay=0.05),
            "loss": ClassCrossentropy(),
            "metrics": [ClassAccuracy()],
        }

    def predict(self, x, batch_size=None, top_k=None, **kwargs):
        """Logits `(batch, num_classes)`; with `top_k`, for each image the
        `top_k` most probable classes as `(name, probability)` pairs, most
        probable first (the class index stands for the name without
        `class_names`)."""
        logits = super().predict(x, batch_size=batch_size, **kwargs)
        if top_k is None:
            return logits
        if not isinstance(top_k, int) or not 1 <= top_k <= self.num_classes:
            raise ValueError(f"top_k must be an int in [1, {self.num_classes}]; got {top_k!r}.")
        logits = np.asarray(logits, dtype="float64")
        probabilities = np.exp(logits - logits.max(axis=-1, keepdims=True))
        probabilities /= probabilities.sum(axis=-1, keepdims=True)
        best = np.argsort(-probabilities, axis=-1, kind="stable")[:, :top_k]
        names = self.class_names or list(range(self.num_classes))
        return [[(names[i], float(row[i])) for i in indices] for row, indices in zip(probabilities, best)]

    @classmethod
    def from_preset(cls, preset, load_weights=True, preprocessor="auto", **kwargs):
        """See `Task.from_preset`. Giving `num_classes` asks for a new head: the
        preset's class names are then not used unless `class_names=` is given."""
        if "num_classes" in kwargs:
            kwargs.setdefault("class_names", None)
        return super().from_preset(preset, load_weights=load_weights, preprocessor=preprocessor, **kwargs)

    def get_config(self):
        config = super().get_config()
        config.update(
            {"num_classes": self.num_classes, "pooling": self.pooling, "dropout": self.dropout,
             "class_names": self.class_names}
        )
        return config
