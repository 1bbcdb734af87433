"""Optimizer updates as one fused kernel where the backend has one.

Keras' Adam on torch updates the variables with `torch._foreach_*` calls, one
pass over every variable per call (eight passes, four of them allocating):
on a CPU, a 4-million-weight model's update takes about 6× the time of
torch's fused Adam kernel, which reads and writes each weight and its two
moments once. JAX and TensorFlow compile the update with XLA, which fuses it
already.
"""

from attention_zoo_keras.backend_support.environment import backend_name


def fused_adam_update():
    """A function applying one Adam step with a fused kernel, or `None`
    where the backend has none to offer (JAX, TensorFlow: XLA fuses).

    The returned function takes `(variables, grads, momentums, velocities,
    learning_rate, step, beta_1, beta_2, epsilon)`: lists of backend tensors
    (updated in place; all of one dtype and device), Python floats, and
    `step` the 1-based step count (`t` below). It computes Keras' Adam (Kingma & Ba, 2015, with ε added
    to `√v` before the bias correction, as in the paper's §2 "ε̂"):

        m ← β₁m + (1 − β₁)g,   v ← β₂v + (1 − β₂)g²
        θ ← θ − α·√(1 − β₂ᵗ)/(1 − β₁ᵗ) · m / (√v + ε)

    torch's kernel adds ε after the bias correction, `√v / √(1 − β₂ᵗ) + ε′`,
    so it is given `ε′ = ε / √(1 − β₂ᵗ)`, which makes the two equal.
    """
    return _torch_fused_adam if backend_name() == "torch" else None


def _torch_fused_adam(variables, grads, momentums, velocities, learning_rate, step, beta_1, beta_2, epsilon):
    import torch

    bias_correction_2 = 1.0 - beta_2**step
    # The kernel walks a weight and its gradient element by element in
    # memory order, so both must be laid out alike (autograd's `.grad`
    # is; a gradient from a recorded backward pass may be a transposed view).
    grads = [
        grad if grad.stride() == weight.stride() else torch.empty_like(weight, dtype=grad.dtype).copy_(grad)
        for weight, grad in zip(variables, grads)
    ]
    steps = [torch.tensor(float(step), device=variables[0].device)] * len(variables)
    with torch.no_grad():  # the variables are leaves that require gradients
        torch._fused_adam_(
            variables, grads, momentums, velocities, [], steps,
            lr=learning_rate, beta1=beta_1, beta2=beta_2, weight_decay=0.0, eps=epsilon / bias_correction_2**0.5,
            amsgrad=False, maximize=False,
        )
