"""The one place that knows which backend Keras runs on.

Everything else in the library is written against `keras.ops`. The questions
whose answer depends on the backend live here: is a tensor a concrete value
(so its contents can be checked before entering a compiled graph), and which
fused attention kernel `keras.ops.dot_product_attention` reaches on this
machine. Backend modules are imported only when they are the active backend,
so importing this library under JAX or PyTorch never imports TensorFlow.
"""

import keras
import numpy as np


def backend_name():
    """`"jax"`, `"tensorflow"` or `"torch"`."""
    return keras.backend.backend()


def is_concrete(value):
    """Whether `value` holds real numbers now (not a symbolic or traced tensor).

    Numpy arrays, Python lists and eager tensors are concrete; Keras symbolic
    tensors, JAX tracers, TensorFlow graph tensors and torch tensors on the
    meta device (used by Keras for shape inference) are not.
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

        if torch.compiler.is_compiling():
            return False
        return isinstance(value, torch.Tensor) and value.device.type != "meta"
    return False


def accelerator():
    """`"gpu"`, `"tpu"` or `"cpu"`: where the backend places new tensors."""
    backend = backend_name()
    if backend == "jax":
        import jax

        return jax.default_backend()
    if backend == "tensorflow":
        import tensorflow as tf

        return "gpu" if tf.config.list_logical_devices("GPU") else "cpu"
    if backend == "torch":
        import torch

        return "gpu" if torch.cuda.is_available() else "cpu"
    return "cpu"


def fused_attention_kernel():
    """Names the kernel `keras.ops.dot_product_attention` runs on this machine.

    Keras dispatches to the backend's own fused implementation; on GPU with
    half-precision inputs it may further pick a flash-attention kernel
    (cuDNN on JAX, FlashAttention/memory-efficient SDPA on torch).
    """
    backend = backend_name()
    device = accelerator()
    if backend == "jax":
        kernel = "jax.nn.dot_product_attention"
        return f"{kernel} (cudnn flash attention for fp16/bf16)" if device == "gpu" else f"{kernel} (xla)"
    if backend == "torch":
        return f"torch.nn.functional.scaled_dot_product_attention ({device})"
    if backend == "tensorflow":
        return f"keras tensorflow dot_product_attention ({device}, xla-fusable)"
    return "keras.ops.dot_product_attention"


def fused_attention_with_dropout():
    """A fused kernel that also drops out attention probabilities, or `None`.

    `keras.ops.dot_product_attention` takes no dropout, so training with
    attention dropout would otherwise need the unfused path. PyTorch's
    `scaled_dot_product_attention` applies dropout inside the kernel (with
    torch's own random generator, which `keras.utils.set_random_seed` seeds).
    The returned function takes `(query, key, value, mask, scale,
    dropout_rate)` with `(batch, length, heads, head_dim)` tensors and a
    boolean mask broadcastable to `(batch, heads, query_length, key_length)`.
    """
    return _torch_attention_with_dropout if backend_name() == "torch" else None


def _torch_attention_with_dropout(query, key, value, mask, scale, dropout_rate):
    import torch

    query, key, value = (torch.transpose(keras.ops.convert_to_tensor(t), 1, 2) for t in (query, key, value))
    if mask is not None:
        mask = keras.ops.convert_to_tensor(mask, dtype="bool")
    output = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, dropout_p=dropout_rate, scale=scale
    )
    return torch.transpose(output, 1, 2)


def write_rows(buffer, start, update):
    """`buffer` with `update` written at `buffer[:, start : start + n]`.

    `start` may be a traced scalar. Under JAX and TensorFlow this is a
    dynamic-update-slice (XLA updates a loop-carried buffer in place). Under
    torch with gradient tracking off (generation runs under
    `torch.no_grad()`), the write is in place and `buffer` itself is
    returned: a key/value cache has a single owner, and Keras' functional
    `slice_update` would copy the whole cache at every decoding step. With
    gradients on, torch takes the functional path too.
    """
    if backend_name() == "torch":
        import torch

        if not torch.is_grad_enabled():
            buffer = keras.ops.convert_to_tensor(buffer).contiguous()  # (copies a broadcast view once)
            update = keras.ops.convert_to_tensor(update, dtype=buffer.dtype)
            buffer.narrow(1, int(start), update.shape[1]).copy_(update)
            return buffer
    starts = [0, start] + [0] * (len(keras.ops.shape(buffer)) - 2)
    return keras.ops.slice_update(buffer, starts, keras.ops.cast(update, buffer.dtype))


def compile_inference(function, variables):
    """`function` compiled for repeated inference on this backend.

    `function(*tensors)` may read `variables` (the model's weights) and run
    `keras.ops.while_loop`s. Returned is a callable with the same arguments:

    * JAX: `jax.jit` of a stateless call: the variables' values are passed
      as arguments (not baked into the program as constants) and mapped
      back onto the variables with a `keras.StatelessScope`.
    * TensorFlow: a `tf.function` compiled by XLA (`jit_compile=True`).
    * torch: eager under `torch.no_grad()` (so cache writes happen in place,
      see `write_rows`); `torch.compile` would pay minutes of compilation per
      new shape for a step that is dominated by matrix products anyway.

    Each backend retraces for new input shapes; callers keep shapes few by
    rounding buffer lengths up.
    """
    backend = backend_name()
    if backend == "jax":
        import jax

        def stateless(values, *args):
            with keras.StatelessScope(state_mapping=list(zip(variables, values))):
                return function(*args)

        jitted = jax.jit(stateless)
        return lambda *args: jitted([variable.value for variable in variables], *args)
    if backend == "tensorflow":
        import tensorflow as tf

        return tf.function(function, jit_compile=True)
    if backend == "torch":
        import torch

        def no_grad(*args):
            with torch.no_grad():
                return function(*args)

        return no_grad
    return function
