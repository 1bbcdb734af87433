"""The losses of ViLBERT's heads (facebookresearch/vilbert-multi-task):

    SummedBinaryCrossentropy     L = mean_batch Σ_k BCE(σ(z_k), s_k)             VQA answers, referring-expression regions
    ViLBERTRegionKLDivergence    L = mean_{masked regions} Σ_c d_c (log d_c − log softmax(z)_c)    masked-region pretraining
"""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="attention_zoo_keras")
class SummedBinaryCrossentropy(keras.losses.Loss):
    """Sigmoid binary cross-entropy between logits and soft targets, summed
    over the last axis (answers, regions), averaged over the batch: the loss
    of ViLBERT's authors for VQA and for referring expressions.

    Equals `keras.losses.BinaryCrossentropy(from_logits=True)` (which averages
    over the last axis) times its length, as the authors scale
    `BCEWithLogitsLoss(reduction="mean")` by `target.size(1)`.

    Example:

    >>> import numpy as np
    >>> logits = np.array([[2.0, -1.0, 0.5]], "float32")
    >>> scores = np.array([[1.0, 0.0, 0.3]], "float32")
    >>> ours = float(SummedBinaryCrossentropy()(scores, logits))
    >>> mean = float(keras.losses.BinaryCrossentropy(from_logits=True)(scores, logits))
    >>> bool(abs(ours - 3 * mean) < 1e-5)
    True
    """

    def __init__(self, name="summed_binary_crossentropy", reduction="sum_over_batch_size", dtype=None):
        super().__init__(name=name, reduction=reduction, dtype=dtype)

    def call(self, y_true, y_pred):
        y_pred = ops.convert_to_tensor(y_pred)
        y_true = ops.cast(y_true, y_pred.dtype)
        return ops.sum(ops.binary_crossentropy(y_true, y_pred, from_logits=True), axis=-1)

    def get_config(self):
        return {"name": self.name, "reduction": self.reduction}


@keras.saving.register_keras_serializable(package="attention_zoo_keras")
class ViLBERTRegionKLDivergence(keras.losses.Loss):
    """Masked-region loss of ViLBERT: `KL(d ‖ softmax(logits))` per region,
    summed over the detector's classes.

    `d` is the detector's class distribution for the region; terms with
    `d_c = 0` count 0. The default reduction, `"mean_with_sample_weight"`,
    averages over the regions whose sample weight is 1 (the masked ones), as
    the authors divide the summed `KLDivLoss` by the number of masked regions.

    Example:

    >>> import numpy as np
    >>> target = np.array([[[0.5, 0.5, 0.0]]], "float32")
    >>> logits = np.log(np.array([[[0.25, 0.5, 0.25]]], "float32"))
    >>> round(float(ViLBERTRegionKLDivergence()(target, logits)), 5)   # 0.5·ln 2
    0.34657
    """

    def __init__(self, name="vilbert_region_kl_divergence", reduction="mean_with_sample_weight", dtype=None):
        super().__init__(name=name, reduction=reduction, dtype=dtype)

    def call(self, y_true, y_pred):
        y_pred = ops.convert_to_tensor(y_pred)
        y_true = ops.cast(y_true, y_pred.dtype)
        log_target = ops.log(ops.where(y_true > 0, y_true, ops.ones_like(y_true)))
        return ops.sum(y_true * (log_target - ops.log_softmax(y_pred, axis=-1)), axis=-1)

    def get_config(self):
        return {"name": self.name, "reduction": self.reduction}
