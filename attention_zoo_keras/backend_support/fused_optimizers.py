"""Optimizer updates as one fused kernel where the backend has one, and
gradients as dense tensors for an update written with `keras.ops`.

Keras' Adam on torch updates the variables with `torch._foreach_*` calls, one
pass over every variable per call (eight passes, four of them allocating):
on a CPU, a 4-million-weight model's update takes about 6× the time of
torch's fused Adam kernel, which reads and writes each weight and its two
moments once. JAX and TensorFlow compile the update with XLA, which fuses it
already.
"""

from attention_zoo_keras.backend_support.environment import backend_name


def dense_gradient(gradient):
    """`gradient` as a dense tensor: TensorFlow gives an embedding table's
    gradient as `tf.IndexedSlices` (the rows a batch used), which Keras'
    ops pass through and Python's operators refuse; other gradients, and
    other backends', are returned as they are."""
    if backend_name() == "tensorflow":
        import tensorflow as tf

        if isinstance(gradient, tf.IndexedSlices):
            return tf.convert_to_tensor(gradient)
    return gradient


def fused_adam_update():
    """A function applying one Adam step with a fused kernel, or `None`
    where the backend has none to offer (JAX, TensorFlow: XLA fuses).

    The returned function takes `(variables, grads, momentums, velocities,
    step_size, beta_1, beta_2, epsilon)`: lists of backend tensors (updated
    in place; all of one dtype and device), `step_size` a scalar tensor on
    their device, and Python floats. It computes

        m ← β₁m + (1 − β₁)g,   v ← β₂v + (1 − β₂)g²
        θ ← θ − step_size · m / (√v + ε)

    which is Keras' Adam (Kingma & Ba, 2015, with ε added to `√v` before
    the bias correction, the paper's §2 "ε̂") for `step_size = α·√(1 − β₂ᵗ)
    / (1 − β₁ᵗ)`, computed by the caller on the device from the step count
    `t`. torch's kernel corrects the bias itself from a step count, and adds
    ε after that correction; it is given a count so large that `β^count`
    underflows to 0 and both corrections are exactly 1. So no value is read
    to the host (a read would wait for the GPU at every step), and ε stays
    where Keras puts it.
    """
    return _torch_fused_adam if backend_name() == "torch" else None


# A step count at which torch's kernel corrects nothing: β^count is 0 for any
# β < 1 − 1e-15, so 1 − β^count is exactly 1.
_UNCORRECTED_STEP = 2.0**60
_uncorrected_steps = {}  # device -> the count as a float32 tensor on it


def _torch_fused_adam(variables, grads, momentums, velocities, step_size, beta_1, beta_2, epsilon):
    import torch

    device = variables[0].device
    if device not in _uncorrected_steps:
        _uncorrected_steps[device] = torch.tensor(_UNCORRECTED_STEP, dtype=torch.float32, device=device)
    # The kernel walks a weight and its gradient element by element in
    # memory order, so both must be laid out alike (autograd's `.grad`
    # is; a gradient from a recorded backward pass may be a transposed view).
    grads = [
        grad if grad.stride() == weight.stride() else torch.empty_like(weight, dtype=grad.dtype).copy_(grad)
        for weight, grad in zip(variables, grads)
    ]
    with torch.no_grad():  # the variables are leaves that require gradients
        torch._fused_adam_(
            variables, grads, momentums, velocities, [], [_uncorrected_steps[device]] * len(variables),
            lr=step_size.to(device=device, dtype=torch.float32), beta1=beta_1, beta2=beta_2, weight_decay=0.0,
            eps=epsilon, amsgrad=False, maximize=False,
        )
