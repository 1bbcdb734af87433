"""Metrics shared by model families."""

from attention_zoo_keras.metrics.class_accuracy import ClassAccuracy
from attention_zoo_keras.metrics.perplexity import BitsPerCharacter
from attention_zoo_keras.metrics.perplexity import Perplexity
