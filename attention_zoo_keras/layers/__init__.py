"""Keras layers shared by every model family."""

from attention_zoo_keras.layers.activations import get_activation
from attention_zoo_keras.layers.feed_forward import FeedForward
from attention_zoo_keras.layers.multi_head_attention import MultiHeadAttention
from attention_zoo_keras.layers.patch_embedding import PatchEmbedding
from attention_zoo_keras.layers.position_embedding import PositionEmbedding
from attention_zoo_keras.layers.transformer_encoder_block import TransformerEncoderBlock
