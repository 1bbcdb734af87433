"""How the library reaches the backends' fused attention kernels: through
`keras.ops.dot_product_attention` (with the mask shaped for JAX's cuDNN
kernel, and under JAX on a GPU each row's key length beside it), or on
torch `scaled_dot_product_attention` directly. Which kernel runs on a GPU
is measured in `benchmarks/gpu_attention_benchmark.py`."""

import keras

from attention_zoo_keras.backend_support.environment import backend_name
from attention_zoo_keras.backend_support.environment import jax_compiles_for_cpu
from attention_zoo_keras.backend_support.environment import jax_compiles_for_gpu

# Whether JAX's cuDNN attention is given each row's key length beside the
# mask (a benchmark contender turns it off to measure the mask alone).
_KEY_LENGTHS_FOR_CUDNN = True
# Whether encoders under JAX move padding last and attend by key lengths (a
# benchmark contender builds its model without, to measure what it gains).
_PADDING_LAST_UNDER_JAX = True


def encoders_move_padding_last():
    """Whether an encoder built now reorders each row's padding after its
    tokens and gives its attention key lengths instead of a mask
    (`layers.padding_last`; the seq2seq model's decoding steps then give
    their cross-attention the sources' lengths too): under JAX, whose cuDNN
    kernel then reads no mask on a GPU (on a CPU the mask the lengths imply
    costs what the padding mask did). Other backends' fused kernels take no
    lengths."""
    return backend_name() == "jax" and _PADDING_LAST_UNDER_JAX


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


def fused_dot_product_attention(query, key, value, mask, scale, is_causal=False, lengths=None):
    """`keras.ops.dot_product_attention(query, key, value, mask=mask,
    scale=scale, is_causal=is_causal)` for `(batch, length, heads,
    head_dim)` tensors and a boolean `mask` broadcastable to `(batch,
    heads, query_length, key_length)` (or `None`).

    `lengths`: `(batch,)` int32 or `None`; given where `mask` is exactly
    each row's keys before its length (`attention.masks.key_length_mask`:
    right-padded rows, as `layers.padding_last` makes them).

    Under JAX on a GPU, in half precision, with a mask, cuDNN's kernel is
    also given each row's key length (`key_lengths`): one past the last key
    that the mask lets any of the row's queries see. Every key beyond it
    has zero weight under the mask, so the result is the same, but the
    kernel skips those keys' blocks instead of reading them and their bias
    (in a right-padded batch, the padding; in a decoding step, the cache
    not yet written). A left-padded row's length is the whole key length,
    so no mask shape needs telling apart. Given `lengths`, cuDNN takes
    them alone and reads no mask at all. Where cuDNN refuses the inputs,
    Keras chooses the kernel as before.
    """
    if (
        mask is not None
        and _KEY_LENGTHS_FOR_CUDNN
        and keras.backend.standardize_dtype(query.dtype) in ("bfloat16", "float16")
        and jax_compiles_for_gpu()
    ):
        try:
            return attention_with_key_lengths(query, key, value, mask, scale, implementation="cudnn", lengths=lengths)
        except (NotImplementedError, ValueError, RuntimeError):  # shapes or a GPU cuDNN does not take
            pass
    upcast = keras.backend.standardize_dtype(query.dtype) == "float16" and jax_compiles_for_cpu()
    if upcast:
        query, key, value = (keras.ops.cast(tensor, "float32") for tensor in (query, key, value))
    output = keras.ops.dot_product_attention(query, key, value, mask=mask, scale=scale, is_causal=is_causal)
    return keras.ops.cast(output, "float16") if upcast else output


def attention_with_key_lengths(query, key, value, mask, scale, implementation, lengths=None):
    """JAX's `dot_product_attention` by `implementation` (`"cudnn"` or
    `"xla"`) with `mask` and `key_lengths(mask, …)`, or with `lengths`
    alone where the caller says they are the mask (see
    `fused_dot_product_attention`)."""
    import jax

    if lengths is None:
        lengths = key_lengths(mask, batch_size=query.shape[0], key_length=key.shape[1])
    else:
        mask = None
    return jax.nn.dot_product_attention(
        query, key, value, mask=mask, scale=scale, key_value_seq_lengths=lengths, implementation=implementation
    )


def key_lengths(mask, batch_size, key_length):
    """`(batch_size,)` int32: per row of the boolean `mask` (broadcastable
    to `(batch, heads, queries, keys)`), one past the last key that any
    query may attend to; `key_length` where none may (the mask alone then
    decides, as without lengths).

    >>> import numpy as np
    >>> mask = np.array([[1, 1, 0, 0], [0, 1, 1, 1], [0, 1, 0, 0], [0, 0, 0, 0]], bool)
    >>> keras.ops.convert_to_numpy(key_lengths(mask[:, None, None, :], 4, 4)).tolist()
    [2, 4, 2, 4]
    """
    mask = keras.ops.convert_to_tensor(mask, dtype="bool")
    while len(mask.shape) < 4:
        mask = keras.ops.expand_dims(mask, 0)
    attended_keys = keras.ops.cast(keras.ops.any(mask, axis=(1, 2)), "int32")
    keys_after_last = keras.ops.argmax(keras.ops.flip(attended_keys, axis=-1), axis=-1)
    lengths = keras.ops.cast(key_length - keys_after_last, "int32")
    return keras.ops.broadcast_to(lengths, (batch_size,))


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
