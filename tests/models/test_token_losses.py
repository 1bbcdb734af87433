"""The language models' default loss is the mean negative log-likelihood
over the positions that carry a label (weight 1): padding, and unmasked
positions of a masked LM, never count, so the loss does not depend on how
wide the batch is padded (as `transformers`' losses with ignored labels)."""

import keras
import numpy as np
import pytest

import attention_zoo_keras as azk
from tests.models.test_raw_inputs import gpt_tokenizer
from tests.support.tiny_models import tiny_gpt

TEXTS = ["ab", "ab ab ab ab ab ab ab ab ab"]


def mean_nll_over_weighted_positions(model, x, y, w):
    logits = keras.ops.convert_to_numpy(model(x, training=False)).astype("float64")
    log_p = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) - logits.max(
        -1, keepdims=True)
    nll = -np.take_along_axis(log_p, np.asarray(y)[..., None], axis=-1)[..., 0]
    return float((nll * w).sum() / w.sum())


@pytest.mark.parametrize("padding", ["buckets", "max_length"])
def test_a_causal_lm_loss_is_the_mean_over_real_tokens(padding):
    keras.utils.set_random_seed(0)
    preprocessor = azk.models.GPTCausalLMPreprocessor(gpt_tokenizer(), sequence_length=24, padding=padding)
    lm = azk.models.GPTCausalLM(tiny_gpt(vocabulary_size=6, max_sequence_length=24), preprocessor=preprocessor)
    x, y, w = preprocessor(TEXTS)
    assert 0 < w.sum() < w.size  # the short text is padded
    expected = mean_nll_over_weighted_positions(lm, x, y, w)

    assert lm.evaluate(TEXTS, batch_size=2, verbose=0)[0] == pytest.approx(expected, rel=1e-5)


def test_a_masked_lm_loss_is_the_mean_over_masked_positions():
    keras.utils.set_random_seed(0)
    vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "great", "film", "the", "plot", "was", "dull"]
    preprocessor = azk.models.BertMaskedLMPreprocessor(
        azk.models.BertTokenizer.from_vocabulary(vocabulary), sequence_length=16, mask_selection_rate=0.5,
        mask_selection_length=6, seed=1)
    lm = azk.models.BertMaskedLM(azk.models.BertBackbone(
        vocabulary_size=len(vocabulary), num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16,
        max_sequence_length=16), preprocessor=preprocessor)
    x, y, w = preprocessor(["a great film", "the plot was dull the plot was dull"])
    assert 0 < w.sum() < w.size  # padded mask positions
    expected = mean_nll_over_weighted_positions(lm, x, y, w)

    lm.compile()
    loss = lm.compute_loss(x, y, lm(x, training=False), sample_weight=w)
    assert float(keras.ops.convert_to_numpy(loss)) == pytest.approx(expected, rel=1e-5)
