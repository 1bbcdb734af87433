"""Adam and AdamW whose torch update is one fused kernel (Kingma & Ba, 2015,
"Adam: A Method for Stochastic Optimization"; Loshchilov & Hutter, 2019,
"Decoupled Weight Decay Regularization"):

    m ← β₁m + (1 − β₁)g,   v ← β₂v + (1 − β₂)g²
    θ ← θ − α·√(1 − β₂ᵗ)/(1 − β₁ᵗ) · m / (√v + ε)

Keras' own Adam on torch makes eight passes over every variable per step;
these make one (`backend_support.fused_adam_update`). The results are
Keras' to float rounding, and on JAX and TensorFlow (where XLA fuses the
update) they are `keras.optimizers.Adam` / `AdamW` unchanged, but for
bfloat16 and float16 variables. For those Keras computes the bias
corrections in the variable's dtype, where β₂ = 0.999 rounds to 1, so
√(1 − β₂ᵗ) = 0 and no variable ever moves; here the step is computed in
float32 on every backend (torch's fused kernel does so too), and only its
result is rounded to the variable's dtype.
"""

import keras

from attention_zoo_keras.backend_support import dense_gradient
from attention_zoo_keras.backend_support import fused_adam_update
from attention_zoo_keras.registration import register

# Variable dtypes whose Adam step is computed in float32 (`update_step`).
LOW_PRECISION_DTYPES = ("bfloat16", "float16")


class FusedAdamStep:
    """Mixin for `keras.optimizers.Adam` and its subclasses: the update step
    through the backend's fused kernel when it has one (not with
    `amsgrad`), one call per dtype and device of the variables; Keras' own
    step otherwise (with a float32 step for half-precision variables)."""

    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        update = None if self.amsgrad else fused_adam_update()
        if update is None:
            return super()._backend_update_step(grads, trainable_variables, learning_rate)
        groups = {}  # (dtype, device) -> [(gradient, variable)]: the kernel takes tensors of one kind
        for grad, variable in zip(grads, trainable_variables):
            groups.setdefault((variable.value.dtype, variable.value.device), []).append((grad, variable))
        index = self._get_variable_index
        step_size = self._step_size(learning_rate)
        for pairs in groups.values():
            update(
                [variable.value for _, variable in pairs],
                [keras.ops.convert_to_tensor(grad) for grad, _ in pairs],
                [self._momentums[index(variable)].value for _, variable in pairs],
                [self._velocities[index(variable)].value for _, variable in pairs],
                step_size,
                float(self.beta_1),
                float(self.beta_2),
                float(self.epsilon),
            )

    def update_step(self, gradient, variable, learning_rate):
        """Keras' Adam step (the backends without a fused kernel call it per
        variable); for a bfloat16 or float16 variable the same step computed
        in float32 (see the module docstring), the moments kept in the
        variable's dtype."""
        if self.amsgrad or keras.backend.standardize_dtype(variable.dtype) not in LOW_PRECISION_DTYPES:
            return super().update_step(gradient, variable, learning_rate)
        ops = keras.ops
        index = self._get_variable_index(variable)
        momentum, velocity = self._momentums[index], self._velocities[index]
        gradient = ops.cast(dense_gradient(gradient), "float32")
        m = ops.cast(momentum, "float32") * self.beta_1 + gradient * (1.0 - self.beta_1)
        v = ops.cast(velocity, "float32") * self.beta_2 + ops.square(gradient) * (1.0 - self.beta_2)
        self.assign(momentum, ops.cast(m, momentum.dtype))
        self.assign(velocity, ops.cast(v, velocity.dtype))
        update = self._step_size(learning_rate) * m / (ops.sqrt(v) + self.epsilon)
        self.assign(variable, ops.cast(ops.cast(variable, "float32") - update, variable.dtype))

    def _step_size(self, learning_rate):
        """`α·√(1 − β₂ᵗ) / (1 − β₁ᵗ)` at step `t = iterations + 1`, as Keras'
        Adam computes it, left on the device."""
        ops = keras.ops
        step = ops.cast(self.iterations + 1, "float32")
        learning_rate = ops.cast(learning_rate, "float32")
        return learning_rate * ops.sqrt(1.0 - ops.power(float(self.beta_2), step)) / (
            1.0 - ops.power(float(self.beta_1), step)
        )


@register
class FusedAdam(FusedAdamStep, keras.optimizers.Adam):
    """`keras.optimizers.Adam` (same arguments and results, but that
    bfloat16 and float16 weights move: see the module docstring) with a
    fused update on torch; the library's tasks compile with it by default.

    Example:

    >>> import numpy as np
    >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    >>> model.compile(optimizer=FusedAdam(1e-3), loss="mse")
    >>> history = model.fit(np.ones((4, 3)), np.zeros((4, 1)), verbose=0)
    """


@register
class FusedAdamW(FusedAdamStep, keras.optimizers.AdamW):
    """`keras.optimizers.AdamW` (same arguments and results, but for
    half-precision weights, as `FusedAdam`) with a fused Adam update on
    torch; the decoupled weight decay stays Keras'."""
