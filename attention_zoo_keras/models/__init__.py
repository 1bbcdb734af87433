"""Model families: backbones, tasks, preprocessors and tokenizers."""

from attention_zoo_keras.models.backbone import Backbone
from attention_zoo_keras.models.bert import BertBackbone
from attention_zoo_keras.models.bert import BertMaskedLM
from attention_zoo_keras.models.bert import BertMaskedLMPreprocessor
from attention_zoo_keras.models.bert import BertPreprocessor
from attention_zoo_keras.models.bert import BertTextClassifier
from attention_zoo_keras.models.bert import BertTextEmbedder
from attention_zoo_keras.models.bert import BertTokenizer
from attention_zoo_keras.models.gpt import GPTBackbone
from attention_zoo_keras.models.gpt import GPTCausalLM
from attention_zoo_keras.models.gpt import GPTCausalLMPreprocessor
from attention_zoo_keras.models.gpt import GPTTokenizer
from attention_zoo_keras.models.preprocessor import Preprocessor
from attention_zoo_keras.models.task import Task
from attention_zoo_keras.models.transformer import TransformerBackbone
from attention_zoo_keras.models.transformer import TransformerSeq2SeqLM
from attention_zoo_keras.models.transformer import TransformerSeq2SeqLMPreprocessor
from attention_zoo_keras.models.transformer import TransformerTokenizer
from attention_zoo_keras.models.vit import ViTBackbone
from attention_zoo_keras.models.vit import ViTImageClassifier
from attention_zoo_keras.models.vit import ViTImageConverter
