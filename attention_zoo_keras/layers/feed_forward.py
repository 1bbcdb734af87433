"""Position-wise feed-forward network (Vaswani et al., 2017, §3.3):

    FFN(x) = act(x W₁ + b₁) W₂ + b₂

Position-wise, so it may be applied to the sequence a chunk of positions at
a time (`chunk_size`; the Reformer's "chunking" of the feed-forward layer,
Kitaev et al., 2020, §3, transformers' `apply_chunking_to_forward`): the
result is the same, and the `(…, length, intermediate_dim)` activation
never exists whole — only one `(…, chunk_size, intermediate_dim)` chunk at a
time.
"""

import numbers

import keras
from keras import ops

from attention_zoo_keras.layers.fused_keras_layers import Dense
from attention_zoo_keras.layers.initializers import clone_initializer
from attention_zoo_keras.layers.activations import get_activation
from attention_zoo_keras.registration import register


@register
class FeedForward(keras.layers.Layer):
    """Two dense layers with an activation between them.

    Args:
        intermediate_dim: int. The width of the hidden layer.
        activation: str. The activation's name (see `layers.activations`),
            e.g. `"gelu"`.
        output_dim: int or None. The output width; `None`: the input's
            width.
        kernel_initializer: str or keras.initializers.Initializer. The
            initializer of both kernels.
        chunk_size: int or None. If set, the inputs
            `(batch, length, …, dim)` are processed `chunk_size` positions
            of axis 1 at a time (the last chunk is padded), one after the other with `keras.ops.map`
            (`lax.map` on JAX, `tf.map_fn` on TensorFlow, a loop on
            PyTorch), so that only one chunk's intermediate activation need
            be live at a time. The output is the unchunked one (to float
            rounding). It saves memory at inference; while training,
            backpropagation still keeps every chunk's activations unless
            the block is recomputed (the Reformer's reversible layers). In
            a compiled function the compiler has the last word on peak
            memory: XLA (JAX, or TensorFlow with `jit_compile`) assigns the
            buffers of the loop, and `tf.map_fn` in a graph may run up to
            10 chunks in parallel. Lengths up to `chunk_size` are not
            chunked. `None` (default): the whole sequence at once.

    Example:

    >>> import numpy as np
    >>> tuple(FeedForward(16)(np.zeros((1, 3, 8), "float32")).shape)
    (1, 3, 8)
    >>> x = np.random.rand(2, 10, 8).astype("float32")
    >>> whole, chunked = FeedForward(16, chunk_size=4), FeedForward(16, chunk_size=4)
    >>> _ = whole(x), chunked(x)
    >>> chunked.set_weights(whole.get_weights())
    >>> whole.chunk_size = None
    >>> from keras import ops
    >>> bool(np.allclose(ops.convert_to_numpy(whole(x)), ops.convert_to_numpy(chunked(x)), atol=1e-6))
    True
    """

    def __init__(
        self,
        intermediate_dim,
        activation="gelu",
        output_dim=None,
        kernel_initializer="glorot_uniform",
        chunk_size=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if chunk_size is not None and (
            not isinstance(chunk_size, numbers.Integral) or isinstance(chunk_size, bool) or chunk_size < 1
        ):
            raise ValueError(f"chunk_size must be None or a positive integer; got {chunk_size!r}.")
        self.chunk_size = None if chunk_size is None else int(chunk_size)
        self.intermediate_dim = intermediate_dim
        self.activation = activation
        self.output_dim = output_dim
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self._activation_fn = get_activation(activation)
        self.intermediate_dense = Dense(
            intermediate_dim,
            kernel_initializer=clone_initializer(kernel_initializer),
            dtype=self.dtype_policy,
            name="intermediate",
        )
        self.output_dense = None

    def build(self, input_shape):
        self.intermediate_dense.build(input_shape)
        self.output_dense = Dense(
            self.output_dim or input_shape[-1],
            kernel_initializer=clone_initializer(self.kernel_initializer),
            dtype=self.dtype_policy,
            name="output",
        )
        self.output_dense.build(tuple(input_shape[:-1]) + (self.intermediate_dim,))

    def _forward(self, x):
        return self.output_dense(self._activation_fn(self.intermediate_dense(x)))

    def call(self, x):
        if self.chunk_size is None:
            return self._forward(x)
        if len(x.shape) < 3:
            raise ValueError(
                f"chunk_size={self.chunk_size} chunks axis 1, the sequence, of inputs (batch, length, ..., dim); "
                f"got inputs of shape {tuple(x.shape)}."
            )
        length = x.shape[1]
        if length is not None and length <= self.chunk_size:
            return self._forward(x)
        return self._chunked_forward(x)

    def _chunked_forward(self, x):
        """`_forward` over chunks of `chunk_size` positions, one at a time."""
        chunk = self.chunk_size
        batch = ops.shape(x)[0]
        length = x.shape[1] if x.shape[1] is not None else ops.shape(x)[1]
        tail = tuple(ops.shape(x)[a] if x.shape[a] is None else x.shape[a] for a in range(2, len(x.shape)))
        padding = (-length) % chunk
        if not (isinstance(padding, int) and padding == 0):
            x = ops.pad(x, [[0, 0], [0, padding]] + [[0, 0]] * (len(x.shape) - 2))
        chunks = ops.reshape(x, (batch, -1, chunk) + tail)  # (B, n, c, …, dim)
        chunks = ops.moveaxis(chunks, 1, 0)  # (n, B, c, …, dim)
        outputs = ops.map(self._forward, chunks)  # (n, B, c, …, out)
        outputs = ops.moveaxis(outputs, 0, 1)
        out_dim = outputs.shape[-1]
        outputs = ops.reshape(outputs, (batch, -1) + tail[:-1] + (out_dim,))
        return outputs[:, :length]

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (self.output_dim or input_shape[-1],)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "intermediate_dim": self.intermediate_dim,
                "activation": self.activation,
                "output_dim": self.output_dim,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "chunk_size": self.chunk_size,
            }
        )
        return config
