"""GPT-2 (Radford et al., 2019): backbone, causal LM, tokenizer, preprocessor, converter."""

from attention_zoo_keras.models.gpt import gpt_convert  # registers the converter
from attention_zoo_keras.models.gpt.gpt_backbone import GPTBackbone
from attention_zoo_keras.models.gpt.gpt_causal_lm import GPTCausalLM
from attention_zoo_keras.models.gpt.gpt_causal_lm_preprocessor import GPTCausalLMPreprocessor
from attention_zoo_keras.models.gpt.gpt_tokenizer import GPTTokenizer
