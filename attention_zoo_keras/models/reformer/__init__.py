"""Reformer (Kitaev et al., 2020): backbone with LSH and local attention and
reversible layers, causal LM, tokenizers, preprocessor, converter."""

from attention_zoo_keras.models.reformer import reformer_convert  # registers the converter
from attention_zoo_keras.models.reformer.reformer_backbone import ReformerBackbone
from attention_zoo_keras.models.reformer.reformer_causal_lm import ReformerCausalLM
from attention_zoo_keras.models.reformer.reformer_masked_lm import ReformerMaskedLM
from attention_zoo_keras.models.reformer.reformer_masked_lm_preprocessor import ReformerMaskedLMPreprocessor
from attention_zoo_keras.models.reformer.reformer_causal_lm_preprocessor import ReformerCausalLMPreprocessor
from attention_zoo_keras.models.reformer.reformer_text_classifier import ReformerTextClassifier
from attention_zoo_keras.models.reformer.reformer_preprocessor import ReformerPreprocessor
from attention_zoo_keras.models.reformer.reformer_tokenizer import ReformerByteTokenizer
from attention_zoo_keras.models.reformer.reformer_tokenizer import ReformerTokenizer
