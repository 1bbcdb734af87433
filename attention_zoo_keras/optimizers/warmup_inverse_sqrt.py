"""The Transformer's learning rate: linear warmup, then inverse square root
decay (Vaswani et al., 2017, "Attention Is All You Need", §5.3):

    lrate = scale · d_model^-0.5 · min(step^-0.5, step · warmup_steps^-1.5)

The rate rises linearly for `warmup_steps` steps, peaks at
`scale · (d_model · warmup_steps)^-0.5`, then falls as `step^-0.5`. The paper
pairs it with Adam, β1 = 0.9, β2 = 0.98, ε = 1e-9 (`transformer_schedule`).
"""

import keras
from keras import ops

from attention_zoo_keras.optimizers.fused_adam import FusedAdam
from attention_zoo_keras.registration import register


@register
class TransformerSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """The learning rate of §5.3 of the Transformer paper.

    Args:
        hidden_dim: int. The model width `d_model`.
        warmup_steps: int. The steps of linear warmup; the paper's 4000.
        scale: float. A factor on the whole rate (1.0 in the paper).

    Keras counts optimizer steps from 0, so the rate of step `s` is the
    formula's at `s + 1`: the first update has a non-zero rate, and the peak
    is at step `warmup_steps - 1`.

    Example:

    >>> schedule = TransformerSchedule(hidden_dim=512, warmup_steps=4000)
    >>> peak = (512 * 4000) ** -0.5
    >>> [round(float(schedule(step)) / peak, 4) for step in (1999, 3999, 15999)]
    [0.5, 1.0, 0.5]
    >>> float(schedule(0)) > 0
    True
    """

    def __init__(self, hidden_dim, warmup_steps=4000, scale=1.0):
        for name, value in (("hidden_dim", hidden_dim), ("warmup_steps", warmup_steps)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int; got {value!r}.")
        if not scale > 0:
            raise ValueError(f"scale must be positive; got {scale!r}.")
        self.hidden_dim = hidden_dim
        self.warmup_steps = warmup_steps
        self.scale = scale

    def __call__(self, step):
        step = ops.cast(step, "float32") + 1.0
        warmup = step * self.warmup_steps**-1.5
        decay = ops.rsqrt(step)
        return self.scale * self.hidden_dim**-0.5 * ops.minimum(warmup, decay)

    def get_config(self):
        return {"hidden_dim": self.hidden_dim, "warmup_steps": self.warmup_steps, "scale": self.scale}


def transformer_schedule(hidden_dim, warmup_steps=4000, scale=1.0, **adam_overrides):
    """Adam with the Transformer's schedule and its β1 = 0.9, β2 = 0.98, ε = 1e-9.

    Args:
        hidden_dim: int. The model width `d_model`.
        warmup_steps: int. The steps of linear warmup.
        scale: float. A factor on the learning rate.
        **adam_overrides: dict. Other `keras.optimizers.Adam` arguments,
            e.g. `clipnorm=1.0` or `beta_2=0.997`; not `learning_rate`.

    Returns:
        A `FusedAdam` (Keras' Adam, fused on torch) whose learning rate is a
        `TransformerSchedule`.

    Example:

    >>> optimizer = transformer_schedule(hidden_dim=512, warmup_steps=4000)
    >>> optimizer.beta_1, optimizer.beta_2, optimizer.epsilon
    (0.9, 0.98, 1e-09)
    >>> optimizer.get_config()["learning_rate"]["class_name"]
    'TransformerSchedule'
    """
    if "learning_rate" in adam_overrides:
        raise TypeError(
            "transformer_schedule sets the learning rate itself; change it with `scale=` "
            "or `warmup_steps=`, or build keras.optimizers.Adam yourself."
        )
    arguments = {"beta_1": 0.9, "beta_2": 0.98, "epsilon": 1e-9, **adam_overrides}
    schedule = TransformerSchedule(hidden_dim, warmup_steps=warmup_steps, scale=scale)
    return FusedAdam(learning_rate=schedule, **arguments)
