"""How the library reaches the backends' fused attention kernels: through
`keras.ops.dot_product_attention` (with the mask shaped for JAX's cuDNN
kernel), or on torch `scaled_dot_product_attention` directly. Which kernel
runs on a GPU is measured in `benchmarks/gpu_attention_benchmark.py`."""

import keras

from attention_zoo_keras.backend_support.environment import backend_name


def mask_for_fused_attention(mask, query_length, key_length):
    """`mask` in the shape that lets `keras.ops.dot_product_attention` reach
    the fused kernel. On JAX, cuDNN takes the mask as a bias of exactly
    `(..., T, S)`; a broadcastable `(B, 1, 1, S)` padding mask makes Keras
    fall back to XLA's unfused attention on GPU, so it is broadcast (a
    boolean `B·T·S` tensor, cheap beside the attention itself). Elsewhere
    the mask is returned as is."""
    if mask is None or backend_name() != "jax":
        return mask
    return keras.ops.broadcast_to(mask, tuple(keras.ops.shape(mask)[:-2]) + (query_length, key_length))


def native_fused_attention():
    """The backend's fused attention kernel called directly, or `None`
    where `keras.ops.dot_product_attention` is the way to it.

    PyTorch's `scaled_dot_product_attention`: it drops out attention
    probabilities inside the kernel (`keras.ops.dot_product_attention`
    takes no dropout; torch's own random generator is used, which
    `keras.utils.set_random_seed` seeds), and it reads strided (transposed)
    inputs, where Keras' torch `dot_product_attention` copies the query,
    key and value to contiguous memory at every call whenever it does not
    pick the flash kernel (always with a mask on a CPU: about 6 % of a
    Marian-sized decoding step, mostly copying the key/value caches). The
    returned function takes `(query, key, value, mask, scale,
    dropout_rate=0.0, is_causal=False)` with `(batch, length, heads,
    head_dim)` tensors and a boolean mask broadcastable to `(batch, heads,
    query_length, key_length)`, or `None` (with `is_causal`, the kernel's
    own causal mode). The mask enters as a large negative bias, as
    in Keras, so a query that may attend nowhere averages the values on
    every backend (a boolean mask would give torch zeros there).
    """
    return _torch_attention if backend_name() == "torch" else None


def _torch_attention(query, key, value, mask, scale, dropout_rate=0.0, is_causal=False):
    import torch

    query, key, value = (torch.transpose(keras.ops.convert_to_tensor(t), 1, 2) for t in (query, key, value))
    if mask is not None:
        mask = keras.ops.convert_to_tensor(mask, dtype="bool")
        mask = torch.where(mask, 0.0, -0.7 * torch.finfo(query.dtype).max).to(query.dtype)
    output = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, dropout_p=dropout_rate, is_causal=is_causal, scale=scale
    )
    return torch.transpose(output, 1, 2)
