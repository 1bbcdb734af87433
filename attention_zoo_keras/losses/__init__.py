"""Losses of the papers' training recipes, and the classifiers' default."""

from attention_zoo_keras.losses.class_cross_entropy import ClassCrossentropy
from attention_zoo_keras.losses.smoothed_cross_entropy import SparseCategoricalCrossentropyWithLabelSmoothing
from attention_zoo_keras.losses.token_cross_entropy import token_cross_entropy
