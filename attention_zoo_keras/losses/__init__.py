"""Losses of the papers' training recipes."""

from attention_zoo_keras.losses.smoothed_cross_entropy import SparseCategoricalCrossentropyWithLabelSmoothing
