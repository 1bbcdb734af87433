"""The language models' default loss: cross-entropy per token, averaged
over the tokens that count.

With `w_i` the weight of position `i` (0 for padding, and for the positions
a masked language model did not mask; 1 otherwise),

    loss = Σ_i w_i · (−log p_θ(y_i | context)) / Σ_i w_i

so neither the padded width nor how the batch was padded changes it, as
with `transformers`' ignored labels (Keras' default reduction,
`"sum_over_batch_size"`, would divide by every position, padding included).
With label smoothing ε, `−log p_θ(y_i)` becomes the cross-entropy against
`(1 − ε)·onehot(y_i) + ε/V` (`SparseCategoricalCrossentropyWithLabelSmoothing`).
"""

import keras

from attention_zoo_keras.losses.smoothed_cross_entropy import SparseCategoricalCrossentropyWithLabelSmoothing


def token_cross_entropy(label_smoothing=0.0):
    """The per-token cross-entropy of logits `(batch, ..., vocabulary)`
    against integer labels, averaged over the positions' weights.

    Args:
        label_smoothing: float. ε in [0, 1); 0 is plain cross-entropy.

    Returns:
        A `keras.losses.Loss` taking logits.

    Example:

    >>> import numpy as np
    >>> logits = np.log(np.array([[[0.5, 0.25, 0.25], [0.2, 0.2, 0.6]]], "float32"))
    >>> labels = np.array([[0, 2]])
    >>> loss = token_cross_entropy()
    >>> round(float(loss(labels, logits, sample_weight=np.array([[1.0, 0.0]]))), 4)  # −log 0.5
    0.6931
    >>> round(float(loss(labels, logits, sample_weight=np.array([[1.0, 1.0]]))), 4)  # −(log 0.5 + log 0.6)/2
    0.602
    """
    if label_smoothing:
        return SparseCategoricalCrossentropyWithLabelSmoothing(
            label_smoothing, from_logits=True, reduction="mean_with_sample_weight"
        )
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="mean_with_sample_weight")
