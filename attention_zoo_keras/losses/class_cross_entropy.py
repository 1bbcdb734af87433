"""Cross-entropy of a classifier's logits against its labels, given either
as class indices or as rows of class probabilities (one-hot, smoothed or
soft targets, as mixup or distillation make them).

With `log p = log_softmax(logits)` over the `C` classes of an example,

    loss = −Σ_c q_c log p_c,    q = onehot(y) for an index y, else the row q

so indices give sparse categorical cross-entropy and rows categorical
cross-entropy, each computed by Keras' own function. Which form the labels
take is read from the static shapes: rows have the logits' rank and `C`
columns (`C > 1`); anything else, `(batch,)` or `(batch, 1)`, is indices.
"""

import keras

from attention_zoo_keras.registration import register


def labels_are_rows(y_true, y_pred):
    """Whether `y_true` holds rows of class probabilities for `y_pred`'s
    `(..., C)` scores (same rank, `C` columns, `C > 1`), not class indices."""
    classes = y_pred.shape[-1]
    return len(y_true.shape) == len(y_pred.shape) and classes not in (None, 1) and y_true.shape[-1] == classes


@register
class ClassCrossentropy(keras.losses.Loss):
    """Cross-entropy of logits against class indices or probability rows.

    The default loss of this library's classifiers: `fit(x, y)` takes `y`
    as class indices `(batch,)` or as rows `(batch, num_classes)` that sum to
    one (one-hot, label-smoothed or soft targets).

    Args:
        from_logits: bool. Whether `y_pred` holds logits (else
            probabilities).
        reduction: str. As for every `keras.losses.Loss`.
        name: str. The loss's name.
        dtype: str or None. The dtype of the computation (`None`:
            `keras.config.floatx()`).

    Example:

    >>> import numpy as np
    >>> loss = ClassCrossentropy()
    >>> logits = np.array([[2.0, 0.5, -1.0], [0.0, 1.0, 0.0]], "float32")
    >>> indices, one_hot = np.array([0, 1]), np.eye(3, dtype="float32")[[0, 1]]
    >>> round(float(loss(indices, logits)), 4) == round(float(loss(one_hot, logits)), 4)
    True
    >>> log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    >>> soft = np.array([[0.5, 0.5, 0.0], [0.0, 1.0, 0.0]], "float32")
    >>> round(float(loss(soft, logits)), 4) == round(float(-(soft * log_p).sum(-1).mean()), 4)
    True
    """

    def __init__(self, from_logits=True, reduction="sum_over_batch_size", name="class_crossentropy", dtype=None):
        super().__init__(name=name, reduction=reduction, dtype=dtype)
        self.from_logits = from_logits

    def call(self, y_true, y_pred):
        if labels_are_rows(y_true, y_pred):
            return keras.losses.categorical_crossentropy(y_true, y_pred, from_logits=self.from_logits)
        return keras.losses.sparse_categorical_crossentropy(y_true, y_pred, from_logits=self.from_logits)

    def get_config(self):
        config = super().get_config()
        config.update({"from_logits": self.from_logits})
        return config
