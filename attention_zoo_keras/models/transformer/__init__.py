"""The encoder-decoder Transformer (Vaswani et al., 2017) and Marian MT."""

from attention_zoo_keras.models.transformer.transformer_backbone import TransformerBackbone
from attention_zoo_keras.models.transformer.transformer_seq2seq_lm_preprocessor import TransformerSeq2SeqLMPreprocessor
from attention_zoo_keras.models.transformer.transformer_tokenizer import TransformerTokenizer
from attention_zoo_keras.models.transformer.transformer_seq2seq_lm import TransformerSeq2SeqLM
from attention_zoo_keras.models.transformer import marian_convert  # noqa: F401 (registers the converter)
