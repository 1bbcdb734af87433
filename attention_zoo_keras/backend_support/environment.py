"""Which backend runs and what it allows: whether a value
is concrete (so it can be checked before a compiled graph), whether
compiled functions relax traced shapes, whether custom gradients work."""

import keras
import numpy as np


def backend_name():
    """`"jax"`, `"tensorflow"` or `"torch"`."""
    return keras.backend.backend()


def _jax_platform():
    """JAX's default platform (`"cpu"`, `"gpu"`, `"tpu"`) when JAX is the
    backend, else `None`."""
    if backend_name() != "jax":
        return None
    import jax

    return jax.default_backend()


def jax_compiles_for_gpu():
    """Whether JAX is the backend and compiles for a GPU (its default
    device)."""
    return _jax_platform() == "gpu"


def jax_compiles_for_cpu():
    """Whether JAX is the backend and compiles for the CPU (its default
    device)."""
    return _jax_platform() == "cpu"


def is_concrete(value):
    """Whether `value` holds real numbers now (not a symbolic or traced tensor).

    Numpy arrays, Python lists and eager tensors are concrete; Keras symbolic
    tensors, JAX tracers, TensorFlow graph tensors, torch tensors on the
    meta device (used by Keras for shape inference) and torch tensors met
    while `torch.compile`, `torch.jit.trace` or `make_fx` records a program
    are not.
    """
    if isinstance(value, (np.ndarray, np.generic, list, tuple, int)):
        return True
    if isinstance(value, keras.KerasTensor):
        return False
    backend = backend_name()
    if backend == "jax":
        import jax

        return isinstance(value, jax.Array) and not isinstance(value, jax.core.Tracer)
    if backend == "tensorflow":
        import tensorflow as tf

        return isinstance(value, tf.Tensor) and hasattr(value, "numpy")
    if backend == "torch":
        import torch
        from torch.fx.experimental.proxy_tensor import get_proxy_mode

        if torch.compiler.is_compiling() or torch.jit.is_tracing() or get_proxy_mode() is not None:
            return False
        return isinstance(value, torch.Tensor) and value.device.type != "meta"
    return False


def relaxes_traced_shapes():
    """Whether Keras' compiled `fit` / `evaluate` / `predict` functions on
    this backend generalise to unknown dimensions once they see a second
    input shape: TensorFlow's `tf.function(reduce_retracing=True)` then
    traces with the sequence length `None`. (JAX compiles per shape; torch
    runs eagerly.)"""
    return backend_name() == "tensorflow"


def compiles_loop_bodies_apart():
    """Whether `compile(jit_compile=True)` compiles a decoding loop's body
    on its own, once per shape of its state: torch's inductor, around a
    Python loop. JAX and TensorFlow compile each whole loop into one
    program, whatever `jit_compile` says."""
    return backend_name() == "torch"


def supports_custom_gradients():
    """Whether `custom_gradient_from_outputs` works on this backend."""
    return backend_name() in ("jax", "tensorflow", "torch")
