"""BERT (Devlin et al., 2019): backbone, tasks, tokenizer, preprocessors, converter."""

from attention_zoo_keras.models.bert import bert_convert  # registers the converter
from attention_zoo_keras.models.bert.bert_backbone import BertBackbone
from attention_zoo_keras.models.bert.bert_masked_lm import BertMaskedLM
from attention_zoo_keras.models.bert.bert_masked_lm_preprocessor import BertMaskedLMPreprocessor
from attention_zoo_keras.models.bert.bert_preprocessor import BertPreprocessor
from attention_zoo_keras.models.bert.bert_text_classifier import BertTextClassifier
from attention_zoo_keras.models.bert.bert_text_embedder import BertTextEmbedder
from attention_zoo_keras.models.bert.bert_tokenizer import BertTokenizer
