"""Accuracy of a classifier whose labels are class indices or rows of class
probabilities: the share of examples whose largest score is at the label's
class (an index y, or argmax of the row q),

    accuracy = mean_b [argmax_c z_bc = y_b].
"""

import keras

from attention_zoo_keras.losses.class_cross_entropy import labels_are_rows
from attention_zoo_keras.registration import register


def class_accuracy(y_true, y_pred):
    """1.0 where `y_pred`'s largest score is at the class of `y_true` (an
    index, or the largest entry of a probability row), else 0.0."""
    if labels_are_rows(y_true, y_pred):
        return keras.metrics.categorical_accuracy(y_true, y_pred)
    return keras.metrics.sparse_categorical_accuracy(y_true, y_pred)


@register
class ClassAccuracy(keras.metrics.MeanMetricWrapper):
    """Accuracy against class indices or probability rows: the default
    metric of this library's classifiers, beside `losses.ClassCrossentropy`.

    Args:
        name: str. The metric's name.
        dtype: str or None. The dtype of its result.

    Example:

    >>> import numpy as np
    >>> metric = ClassAccuracy()
    >>> metric.update_state(np.eye(3)[[0, 2]], np.array([[3.0, 1.0, 0.0], [0.0, 2.0, 1.0]]))
    >>> float(metric.result())
    0.5
    """

    def __init__(self, name="accuracy", dtype=None):
        super().__init__(class_accuracy, name=name, dtype=dtype)

    def get_config(self):
        return {"name": self.name, "dtype": self.dtype}
