"""ViLBERT for image-text retrieval (Lu et al., 2019, §3.2 "Caption-Based
Image Retrieval"; Flickr30k, COCO), as the authors fine-tune it
(facebookresearch/vilbert-multi-task, `VILBertForVLTasks`, the head
`vil_logit`, task type `VL-logit`).

Each (text, image) pair gets one alignment score from the fused pooled
outputs,

    s = w · Dropout(h_T ⊙ h_V) + b           ("mul"; h_T + h_V for "sum")

and the candidates of one query compete in a softmax: the authors train
with one matching image and three mismatched ones per caption, cross-entropy
on the index of the match, and rank all images by `s` at test time.
"""

import keras
import numpy as np
from keras import ops

from attention_zoo_keras.layers.classification_head import classification_head
from attention_zoo_keras.losses.class_cross_entropy import ClassCrossentropy
from attention_zoo_keras.metrics.class_accuracy import ClassAccuracy
from attention_zoo_keras.models.input_validation import check_class_labels
from attention_zoo_keras.models.input_validation import concrete_shape
from attention_zoo_keras.models.task import Task
from attention_zoo_keras.models.vilbert.vilbert_backbone import ViLBERTBackbone
from attention_zoo_keras.models.vilbert.vilbert_fusion import fuse_pooled_outputs
from attention_zoo_keras.models.vilbert.vilbert_preprocessor import ViLBERTRetrievalPreprocessor
from attention_zoo_keras.optimizers.fused_adam import FusedAdamW
from attention_zoo_keras.registration import register


class MergeCandidates(keras.layers.Layer):
    """`(batch, candidates, ...)` → `(batch · candidates, ...)`."""

    def call(self, x):
        shape = ops.shape(x)
        return ops.reshape(x, (-1, *shape[2:]))

    def compute_output_shape(self, shape):
        merged = None if shape[0] is None or shape[1] is None else shape[0] * shape[1]
        return (merged, *shape[2:])


class SplitCandidates(keras.layers.Layer):
    """Scores `(batch · candidates, 1)` → `(batch, candidates)`, the two
    sizes read from `reference` `(batch, candidates, ...)`."""

    def call(self, scores, reference):
        shape = ops.shape(reference)
        return ops.reshape(scores, (shape[0], shape[1]))

    def compute_output_shape(self, scores_shape, reference_shape):
        return tuple(reference_shape[:2])


@register
class ViLBERTImageTextRetriever(Task):
    """Scores how well each of several candidate (text, image) pairs match:
    caption-based image retrieval, or image-based caption retrieval.

    `Dense(1)` on the fused pooled outputs (Lu et al., 2019; the authors'
    `vil_logit`), one score per candidate; the candidates of one example
    compete in a softmax.

    Args:
        backbone: `ViLBERTBackbone`. The two-stream encoder.
        fusion: str. `"mul"` (the authors' default) or `"sum"`.
        dropout: float. Dropout on the fused vector (0.1, as the authors').
        preprocessor: `ViLBERTRetrievalPreprocessor` or None. Raw queries
            and their candidates in.

    Inputs: the backbone's features with a candidates axis after the batch
    axis: `token_ids`, `segment_ids`, `padding_mask` `(batch, candidates,
    length)`, `region_features` `(batch, candidates, regions, feature_dim)`,
    `region_boxes` `(batch, candidates, regions, 5)`, `region_mask`
    `(batch, candidates, regions)`; `ViLBERTRetrievalPreprocessor` makes
    them from raw queries and candidates. Output: scores `(batch,
    candidates)`.

    `compile()` defaults to AdamW (2e-5, the authors' retrieval rate) and
    cross-entropy on the index of the matching candidate (the authors'
    objective, with 4 candidates; or rows of candidate probabilities,
    `losses.ClassCrossentropy`), and its accuracy.

    Example:

    >>> import numpy as np
    >>> backbone = ViLBERTBackbone(
    ...     vocabulary_size=50, num_layers=2, num_heads=2, hidden_dim=8, intermediate_dim=16,
    ...     region_feature_dim=6, visual_num_layers=2, visual_num_heads=2, visual_hidden_dim=4,
    ...     visual_intermediate_dim=8, co_attention_dim=4, co_attention_num_heads=2,
    ...     co_attention_text_layers=[1, 2], co_attention_visual_layers=[0, 1],
    ...     max_sequence_length=8)
    >>> retriever = ViLBERTImageTextRetriever(backbone)
    >>> ids = np.tile(np.array([2, 15, 27, 3, 0]), (1, 4, 1))   # one caption, 4 candidate images
    >>> scores = retriever.predict({"token_ids": ids, "segment_ids": np.zeros_like(ids),
    ...                             "padding_mask": (ids > 0).astype("int32"),
    ...                             "region_features": np.random.rand(1, 4, 3, 6).astype("float32"),
    ...                             "region_boxes": np.tile(np.array([0, 0, 1, 1, 1], "float32"), (1, 4, 3, 1)),
    ...                             "region_mask": np.ones((1, 4, 3), "int32")}, verbose=0)
    >>> scores.shape
    (1, 4)
    """

    backbone_cls = ViLBERTBackbone
    preprocessor_cls = ViLBERTRetrievalPreprocessor
    serving_shared_axes = {1: "candidates"}

    def __init__(self, backbone, fusion="mul", dropout=0.1, preprocessor=None, **kwargs):
        initializer = keras.initializers.TruncatedNormal(stddev=backbone.initializer_range)
        dtype = backbone.dtype_policy
        inputs = {
            name: keras.Input(shape=(None, *tensor.shape[1:]), dtype=tensor.dtype, name=name)
            for name, tensor in backbone.input.items()
        }
        pairs = {name: MergeCandidates(dtype=dtype, name=f"merge_{name}")(value) for name, value in inputs.items()}
        fused = fuse_pooled_outputs(backbone(pairs), fusion, dtype, name="retrieval")
        scores = classification_head(
            fused, 1, dropout, initializer, dtype=dtype, name="retrieval", output_name="retrieval_score"
        )
        scores = SplitCandidates(dtype=dtype, name="retrieval_scores")(scores, inputs["token_ids"])
        super().__init__(inputs=inputs, outputs=scores, backbone=backbone, preprocessor=preprocessor, **kwargs)
        self.fusion = fusion
        self.dropout = dropout

    def validate_inputs(self, inputs):
        """Checks the candidates axis, then the flattened pairs as the backbone does."""
        shapes = {name: concrete_shape(value) for name, value in inputs.items()}
        for name, shape in shapes.items():
            expected = self.input[name].shape if name in self.input else shape
            if len(shape) != len(expected):
                sizes = ", ".join("..." if size is None else str(size) for size in expected[2:])
                raise ValueError(
                    f"'{name}' must be (batch, candidates, {sizes}): a candidates axis after the batch axis; "
                    f"got shape {shape}."
                )
        leading = {name: shape[:2] for name, shape in shapes.items()}
        if len(set(leading.values())) > 1:
            raise ValueError(
                "Every input must have the same batch and candidates sizes; got "
                + ", ".join(f"{name}: {size}" for name, size in leading.items())
                + "."
            )
        pairs = {
            name: np.reshape(ops.convert_to_numpy(value), (-1, *shapes[name][2:])) for name, value in inputs.items()
        }
        self.backbone.validate_inputs(pairs)

    def validate_labels(self, labels, inputs=None):
        """Labels are the index of each query's matching candidate."""
        if inputs is not None:
            check_class_labels(labels, inputs["token_ids"].shape[1], kind="candidates")

    def default_compile_arguments(self):
        return {
            "optimizer": FusedAdamW(2e-5, weight_decay=0.01),
            "loss": ClassCrossentropy(),
            "metrics": [ClassAccuracy()],
        }

    def get_config(self):
        config = super().get_config()
        config.update({"fusion": self.fusion, "dropout": self.dropout})
        return config

