"""Vision Transformer (Dosovitskiy et al., 2021): backbone, image converter,
image classifier and checkpoint converter."""

from attention_zoo_keras.models.vit import vit_convert  # registers the converter
from attention_zoo_keras.models.vit.vit_backbone import ViTBackbone
from attention_zoo_keras.models.vit.vit_image_classifier import ViTImageClassifier
from attention_zoo_keras.models.vit.vit_image_converter import ViTImageConverter
