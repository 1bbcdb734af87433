"""Transformer-XL (Dai et al., 2019): backbone, causal LM with adaptive
softmax, word-level tokenizer, stream preprocessor, converter."""

from attention_zoo_keras.models.transformer_xl import transformer_xl_convert  # registers the converter
from attention_zoo_keras.models.transformer_xl.transformer_xl_backbone import TransformerXLBackbone
from attention_zoo_keras.models.transformer_xl.transformer_xl_causal_lm import TransformerXLCausalLM
from attention_zoo_keras.models.transformer_xl.transformer_xl_causal_lm_preprocessor import TransformerXLCausalLMPreprocessor
from attention_zoo_keras.models.transformer_xl.transformer_xl_tokenizer import TransformerXLTokenizer
