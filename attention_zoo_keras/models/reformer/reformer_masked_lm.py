"""The Reformer encoder (Kitaev et al., 2020, "Reformer: The Efficient
Transformer", ICLR 2020) with a masked-language-model head: logits of the
original token at every position, from the concatenated streams,

    logits = [Y1 ; Y2]_normed W + b       (W: 2·d × vocabulary)

As `transformers`' `ReformerForMaskedLM` (`ReformerOnlyLMHead`), whose
checkpoints convert unchanged (`lm_head.decoder.weight` → `lm_head/kernel`,
`lm_head.bias` → `lm_head/bias`, the keys of `ReformerCausalLM`'s head).
The bias is the original model's; `transformers` 5.x ignores its
`lm_head.bias`, so its logits equal these only where that bias is zero.
The backbone must be bidirectional (`is_causal=False`: transformers'
`is_decoder=False`), as a masked position is predicted from both sides.
"""

from attention_zoo_keras.models.input_validation import check_id_range
from attention_zoo_keras.models.reformer.reformer_backbone import ReformerBackbone
from attention_zoo_keras.models.reformer.reformer_causal_lm import language_model_compile_arguments
from attention_zoo_keras.models.reformer.reformer_causal_lm import language_model_head
from attention_zoo_keras.models.reformer.reformer_masked_lm_preprocessor import ReformerMaskedLMPreprocessor
from attention_zoo_keras.models.task import Task
from attention_zoo_keras.registration import register


@register
class ReformerMaskedLM(Task):
    """Predicts the original token at every position of a (masked) text.

    Args:
        backbone: `ReformerBackbone`. A bidirectional one (`is_causal=False`).
        preprocessor: `ReformerMaskedLMPreprocessor` or None. Masks raw text
            for `fit`.

    Inputs: the backbone's `token_ids` and `padding_mask` `(batch, length)`.
    Output: logits `(batch, length, vocabulary_size)`. `compile()` defaults
    to Adam (1e-4), sparse categorical cross-entropy on logits and accuracy,
    both weighted by the sample weights (the preprocessor's: 1 on the masked
    positions only) and averaged over the weighted positions.

    Training needs sequences whose length is a multiple of the chunk
    lengths (and, with axial positions, exactly `n₁·n₂` long); at inference
    other lengths are padded and cut back.

    Example:

    >>> import numpy as np
    >>> backbone = ReformerBackbone(vocabulary_size=32, hidden_dim=8, num_heads=2, head_dim=4, intermediate_dim=16,
    ...                             attention=["local", "lsh"], is_causal=False, attention_options={
    ...                                 "lsh": {"num_buckets": 4, "chunk_length": 4, "num_chunks_after": 1},
    ...                                 "local": {"block_size": 4, "num_memory_blocks_after": 1}},
    ...                             axial_pos_shape=(4, 4), axial_pos_embds_dim=(4, 4))
    >>> mlm = ReformerMaskedLM(backbone)
    >>> ids = np.array([[5, 6, 0, 8, 9, 10, 11, 12]])
    >>> tuple(mlm.predict({"token_ids": ids, "padding_mask": np.ones_like(ids)}, verbose=0).shape)
    (1, 8, 32)
    """

    backbone_cls = ReformerBackbone
    preprocessor_cls = ReformerMaskedLMPreprocessor

    def __init__(self, backbone, preprocessor=None, **kwargs):
        if backbone.is_causal:
            raise ValueError(
                "ReformerMaskedLM needs a bidirectional backbone (is_causal=False; transformers' is_decoder=False): "
                "a causal one cannot see the tokens after a masked position."
            )
        inputs = dict(backbone.input)
        head = language_model_head(backbone)
        logits = head(backbone(inputs)["sequence_output"])
        super().__init__(inputs=inputs, outputs=logits, backbone=backbone, preprocessor=preprocessor, **kwargs)
        self.lm_head = head

    def validate_labels(self, labels, inputs=None):
        """Labels are the original tokens' ids, in the vocabulary."""
        check_id_range("labels", labels, self.backbone.vocabulary_size)

    def default_compile_arguments(self):
        return language_model_compile_arguments()
