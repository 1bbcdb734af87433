"""Cross-entropy against label-smoothed targets (Szegedy et al., 2016,
"Rethinking the Inception Architecture for Computer Vision", §7; used with
ε_ls = 0.1 by Vaswani et al., 2017, "Attention Is All You Need", §5.4).

The target for label `y` over a vocabulary of `V` is

    q = (1 − ε) · onehot(y) + ε / V

so, with `log p = log_softmax(logits)`,

    loss = −Σ_v q_v log p_v = −(1 − ε) · log p_y − ε · mean_v(log p_v)

which needs no one-hot tensor. This is the convention of
`torch.nn.functional.cross_entropy(label_smoothing=ε)` and of Keras'
`CategoricalCrossentropy(label_smoothing=ε)`.
"""

import keras
from keras import ops

from attention_zoo_keras.registration import register


@register
class SparseCategoricalCrossentropyWithLabelSmoothing(keras.losses.Loss):
    """Sparse categorical cross-entropy with label smoothing.

    Args:
        label_smoothing: float. ε in [0, 1]; 0 is plain sparse
            cross-entropy.
        from_logits: bool. Whether `y_pred` holds logits (else
            probabilities).
        reduction: str. As for every `keras.losses.Loss`. The default
            `"sum_over_batch_size"` divides by every position, padding
            included; `"mean_with_sample_weight"` divides by the sum of the
            weights, i.e. averages over the real tokens.
        name: str. The loss's name.
        dtype: str or None. The dtype of the computation (`None`:
            `keras.config.floatx()`).

    `y_true` holds integer labels `(batch, ...)` and `y_pred` scores
    `(batch, ..., vocabulary)`. Give padded positions weight 0 through
    `sample_weight` (or a Keras mask); their labels must still be valid ids
    (e.g. the padding id).

    Example:

    >>> import numpy as np
    >>> loss = SparseCategoricalCrossentropyWithLabelSmoothing(
    ...     label_smoothing=0.1, reduction="mean_with_sample_weight")
    >>> logits = np.array([[[2.0, 0.5, -1.0], [0.0, 0.0, 0.0]]], dtype="float32")
    >>> labels = np.array([[0, 2]])            # the second position is padding
    >>> round(float(loss(labels, logits, sample_weight=np.array([[1.0, 0.0]]))), 4)
    0.3913
    >>> smoothed_target = 0.9 * np.array([1.0, 0.0, 0.0]) + 0.1 / 3
    >>> log_p = logits[0, 0] - np.log(np.exp(logits[0, 0]).sum())
    >>> round(float(-(smoothed_target * log_p).sum()), 4)
    0.3913
    """

    def __init__(
        self,
        label_smoothing=0.1,
        from_logits=True,
        reduction="sum_over_batch_size",
        name="sparse_categorical_crossentropy_with_label_smoothing",
        dtype=None,
    ):
        if not 0 <= label_smoothing <= 1:
            raise ValueError(f"label_smoothing must be in [0, 1]; got {label_smoothing!r}.")
        super().__init__(name=name, reduction=reduction, dtype=dtype)
        self.label_smoothing = label_smoothing
        self.from_logits = from_logits

    def call(self, y_true, y_pred):
        labels = ops.cast(y_true, "int32")
        if len(labels.shape) == len(y_pred.shape):
            labels = ops.squeeze(labels, axis=-1)
        if self.from_logits:
            log_probabilities = ops.log_softmax(y_pred, axis=-1)
        else:
            probabilities = y_pred / ops.sum(y_pred, axis=-1, keepdims=True)
            epsilon = keras.config.epsilon()
            log_probabilities = ops.log(ops.clip(probabilities, epsilon, 1.0 - epsilon))
        label_log_probability = ops.take_along_axis(
            log_probabilities, ops.expand_dims(labels, axis=-1), axis=-1
        )[..., 0]
        mean_log_probability = ops.mean(log_probabilities, axis=-1)
        smoothing = self.label_smoothing
        return -(1.0 - smoothing) * label_log_probability - smoothing * mean_log_probability

    def get_config(self):
        config = super().get_config()
        config.update({"label_smoothing": self.label_smoothing, "from_logits": self.from_logits})
        return config
