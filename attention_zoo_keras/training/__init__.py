"""Training recipes: keeping the last checkpoints and averaging them."""

from attention_zoo_keras.training.checkpoint_averaging import KeepLastCheckpoints
from attention_zoo_keras.training.checkpoint_averaging import average_checkpoints
