"""Language-model metrics from the mean negative log-likelihood per token,

    NLL = −(1/N) Σ_t log p(x_t | x_<t)
    perplexity = exp(NLL),     bits per character = NLL / ln 2

accumulated over every batch of an evaluation (token-weighted, so batches
with padding count only their real tokens), not averaged per batch.
"""

import math

import keras
from keras import ops

from attention_zoo_keras.registration import register


@register
class Perplexity(keras.metrics.Metric):
    """`exp` of the mean negative log-likelihood of the labels.

    Args:
        from_logits: bool. `True` if predictions are logits or
            log-probabilities (normalised with a log-softmax, which leaves
            log-probabilities unchanged); `False` for probabilities.

    `update_state(labels, predictions, sample_weight=None)` takes labels
    `(batch, length)` and predictions `(batch, length, vocabulary)`; a
    sample weight of 0 leaves a position out (padding).

    Example:

    >>> import numpy as np
    >>> metric = Perplexity()
    >>> metric.update_state(np.array([[0, 1]]), np.log(np.full((1, 2, 4), 0.25, "float32")))
    >>> round(float(metric.result()), 4)
    4.0
    """

    def __init__(self, from_logits=True, name="perplexity", **kwargs):
        super().__init__(name=name, **kwargs)
        self.from_logits = from_logits
        self.total = self.add_variable(shape=(), initializer="zeros", dtype="float32", name="total")
        self.count = self.add_variable(shape=(), initializer="zeros", dtype="float32", name="count")

    def update_state(self, y_true, y_pred, sample_weight=None):
        losses = keras.losses.sparse_categorical_crossentropy(
            y_true, ops.cast(y_pred, "float32"), from_logits=self.from_logits
        )
        weights = ops.ones_like(losses) if sample_weight is None else ops.cast(sample_weight, "float32")
        weights = ops.broadcast_to(weights, ops.shape(losses))
        self.total.assign_add(ops.sum(losses * weights))
        self.count.assign_add(ops.sum(weights))

    def mean_negative_log_likelihood(self):
        """The token-weighted mean NLL so far (nats)."""
        return ops.divide_no_nan(self.total, self.count)

    def result(self):
        return ops.exp(self.mean_negative_log_likelihood())

    def reset_state(self):
        self.total.assign(0.0)
        self.count.assign(0.0)

    def get_config(self):
        return {**super().get_config(), "from_logits": self.from_logits}


@register
class BitsPerCharacter(Perplexity):
    """The mean negative log-likelihood in bits, for character-level models
    (enwik8, text8): `NLL / ln 2`.

    Example:

    >>> import numpy as np
    >>> metric = BitsPerCharacter()
    >>> metric.update_state(np.array([[0, 1]]), np.log(np.full((1, 2, 4), 0.25, "float32")))
    >>> round(float(metric.result()), 4)
    2.0
    """

    def __init__(self, from_logits=True, name="bits_per_character", **kwargs):
        super().__init__(from_logits=from_logits, name=name, **kwargs)

    def result(self):
        return self.mean_negative_log_likelihood() / math.log(2.0)
