"""Optimizers and learning-rate schedules of the papers' training recipes."""

from attention_zoo_keras.optimizers.fused_adam import FusedAdam
from attention_zoo_keras.optimizers.fused_adam import FusedAdamW
from attention_zoo_keras.optimizers.warmup_inverse_sqrt import TransformerSchedule
from attention_zoo_keras.optimizers.warmup_inverse_sqrt import transformer_schedule
