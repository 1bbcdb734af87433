"""GPT-2 with its language-model head: next-token logits from the hidden
states and the (tied) token embedding matrix,

    logits = H Eᵀ     (no bias)
"""

import keras
from keras import ops

from attention_zoo_keras.models.gpt.gpt_backbone import GPTBackbone
from attention_zoo_keras.models.gpt.gpt_preprocessor import GPTCausalLMPreprocessor
from attention_zoo_keras.models.task import Task
from attention_zoo_keras.registration import register


class TiedLMHead(keras.layers.Layer):
    """Vocabulary logits `h Eᵀ` with `E` the backbone's token embedding
    matrix (shared, so this layer owns no weights).

    Args:
        token_embedding: the backbone's `keras.layers.Embedding`.
    """

    def __init__(self, token_embedding, **kwargs):
        super().__init__(**kwargs)
        self.token_embedding = token_embedding

    def call(self, hidden):
        embeddings = ops.cast(self.token_embedding.embeddings, hidden.dtype)
        return ops.matmul(hidden, ops.transpose(embeddings))

    def compute_output_shape(self, hidden_shape):
        return tuple(hidden_shape[:-1]) + (self.token_embedding.input_dim,)


@register
class GPTCausalLM(Task):
    """Predicts the next token at every position.

    Args:
        backbone: a `GPTBackbone`.
        preprocessor: a `GPTCausalLMPreprocessor` (so `fit` takes raw text).

    Inputs: the backbone's `token_ids` and `padding_mask`. Output: logits
    `(batch, length, vocabulary_size)`, float32 only if the backbone is.

    Example:

    >>> lm = GPTCausalLM.from_preset("gpt2")                        # doctest: +SKIP
    >>> lm.fit(["some text to continue pretraining on"], epochs=1)  # doctest: +SKIP
    """

    backbone_cls = GPTBackbone
    preprocessor_cls = GPTCausalLMPreprocessor

    def __init__(self, backbone, preprocessor=None, **kwargs):
        inputs = dict(backbone.input)
        head = TiedLMHead(backbone.token_embedding, dtype=backbone.dtype_policy, name="lm_head")
        logits = head(backbone(inputs)["sequence_output"])
        super().__init__(inputs=inputs, outputs=logits, backbone=backbone, preprocessor=preprocessor, **kwargs)
        self.lm_head = head

    def default_compile_arguments(self):
        return {
            "optimizer": keras.optimizers.AdamW(5e-5, weight_decay=0.01),
            "loss": keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            "weighted_metrics": [keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
        }
