"""Sentence embeddings from BERT, as sentence-transformers computes them
(Reimers & Gurevych, 2019, "Sentence-BERT"): pool the token states, then
optionally L2-normalise.

    mean:  e = Σₜ mₜ hₜ / Σₜ mₜ      (mₜ the padding mask)
    cls:   e = h₀
    e ← e / max(‖e‖₂, ε)   if normalize
"""

import keras
from keras import ops

from attention_zoo_keras.models.bert.bert_backbone import BertBackbone
from attention_zoo_keras.models.bert.bert_preprocessor import BertPreprocessor
from attention_zoo_keras.models.task import Task
from attention_zoo_keras.optimizers.fused_adam import FusedAdamW
from attention_zoo_keras.registration import register

POOLING_MODES = ("mean", "cls")


@register
class BertTextEmbedder(Task):
    """Maps texts to fixed-size vectors for semantic search and clustering.

    Args:
        backbone: `BertBackbone`. The encoder.
        preprocessor: `BertPreprocessor` or None. Takes raw strings.
        pooling: str. `"mean"` (over non-padding tokens) or `"cls"`.
        normalize: bool. L2-normalise the embeddings (cosine similarity
            becomes a dot product).

    Example:

    >>> embedder = BertTextEmbedder.from_preset("minilm_l6")              # doctest: +SKIP
    >>> vectors = embedder.predict(["a cat sits", "a kitten is sitting"]) # doctest: +SKIP
    >>> float(vectors[0] @ vectors[1])                                   # doctest: +SKIP
    0.8...
    """

    backbone_cls = BertBackbone
    backbone_outputs = ("sequence_output",)
    preprocessor_cls = BertPreprocessor

    def __init__(self, backbone, preprocessor=None, pooling="mean", normalize=True, **kwargs):
        if pooling not in POOLING_MODES:
            raise ValueError(f"pooling must be one of {POOLING_MODES}; got '{pooling}'.")
        inputs = backbone.input
        sequence_output = backbone(inputs)["sequence_output"]
        if pooling == "mean":
            mask = ops.expand_dims(ops.cast(inputs["padding_mask"], sequence_output.dtype), -1)
            pooled = ops.sum(sequence_output * mask, axis=1) / ops.maximum(ops.sum(mask, axis=1), 1e-9)
        else:
            pooled = sequence_output[:, 0, :]
        if normalize:
            norm = ops.sqrt(ops.sum(ops.square(pooled), axis=-1, keepdims=True))
            pooled = pooled / ops.maximum(norm, 1e-12)
        super().__init__(inputs=inputs, outputs=pooled, backbone=backbone, preprocessor=preprocessor, **kwargs)
        self.pooling = pooling
        self.normalize = normalize

    def default_compile_arguments(self):
        return {"optimizer": FusedAdamW(2e-5), "loss": keras.losses.CosineSimilarity()}

    def get_config(self):
        config = super().get_config()
        config.update({"pooling": self.pooling, "normalize": self.normalize})
        return config
