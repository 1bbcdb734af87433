"""Multi-head attention (Vaswani et al., 2017, §3.2.2):

    MultiHead(X, Y) = Concat(head_1, …, head_h) W_O,
    head_i = Attention(X W_Q^i, Y W_K^i, Y W_V^i)

This layer owns the four projections and the mechanism's own weights, if
it has any (the relative embeddings of `relative`, the score network of
`additive`); `Attention` is any mechanism from `attention_zoo_keras.attention`,
chosen by name, with its options (`attention_options`). Incremental decoding
goes through the mechanism's decoding cache (`attention.get_decoding`):
a key/value cache for softmax, the recurrent state `(S, z)` for linear.
Inside `layers.attention_maps` a call also records its attention
probabilities.
"""

import keras
from keras import ops

from attention_zoo_keras.layers.fused_keras_layers import Dense
from attention_zoo_keras.layers.initializers import clone_initializer
from attention_zoo_keras.attention import attention_probabilities
from attention_zoo_keras.attention import get_mechanism
from attention_zoo_keras.attention.masks import key_length_mask
from attention_zoo_keras.attention.registry import call_options
from attention_zoo_keras.attention.registry import check_options
from attention_zoo_keras.attention.registry import get_decoding
from attention_zoo_keras.attention.registry import mechanism_inputs
from attention_zoo_keras.attention.registry import mechanism_weights
from attention_zoo_keras.attention.registry import takes_key_lengths
from attention_zoo_keras.backend_support import is_concrete
from attention_zoo_keras.layers.attention_maps import active_recorder
from attention_zoo_keras.layers.attention_maps import record_probabilities
from attention_zoo_keras.registration import register


@register
class MultiHeadAttention(keras.layers.Layer):
    """Projects inputs to heads, applies an attention mechanism, projects back.

    Args:
        num_heads: int. The number of attention heads.
        head_dim: int. The size of each head's query, key and value.
        output_dim: int or None. The size of the output; `None`: the query
            input's size.
        attention: str. The name of the mechanism (see
            `attention.mechanism_names()`).
        attention_options: dict or None. The mechanism's options (see
            `attention.registry.mechanism_options(attention)`), e.g.
            `{"block_size": 64}` for local attention or
            `{"max_distance": 127, "per_head": True}` for relative attention;
            options that shape the mechanism's weights go to its weights
            function, the others to every call.
        dropout: float. The dropout rate on the attention probabilities.
        use_bias: bool. Whether the projections have biases.
        kernel_initializer: str or keras.initializers.Initializer. The
            initializer of the projection kernels.
        shared_query_key: bool. One projection gives both the queries and
            the keys (`W_K = W_Q`; there is no `key` projection), as the
            Reformer's LSH attention needs (Kitaev et al., 2020, §3).

    Call args:
        query: tensor of shape `(batch, query_length, dim)`. The queries'
            inputs.
        value: tensor of shape `(batch, key_length, dim)` or None. The keys'
            and values' inputs; `None`: `query` (self-attention).
        key_value: tuple of two tensors or None. Instead of `value`, its
            keys and values already projected to heads by
            `project_key_value(value)` — cross-attention during decoding
            projects the encoder's output once, not at every step.
        attention_mask: bool tensor of shape
            `(batch, query_length or 1, key_length)` or None. `True` where a
            query may attend to a key.
        key_lengths: int tensor of shape `(batch,)` or None. Instead of
            `attention_mask`, without a cache: row b's queries see its first
            `key_lengths[b]` keys (right-padded rows, e.g. reordered by
            `layers.padding_last_order`). A mechanism that takes them
            (softmax: under JAX on a GPU cuDNN then reads no mask) gets the
            lengths themselves; the others the mask they imply.
        is_causal: bool. Also mask out later positions.
        cache: tuple of tensors or None. A decoding cache for incremental
            decoding (self-attention only), from `initial_cache`: for softmax a
            `(key_cache, value_cache)` pair, each `(batch, max_length,
            num_heads, head_dim)`, written at `cache_update_index`, the
            queries attending over the whole cache; for linear the
            recurrent state `(S, z)`, which every position must be fed
            into exactly once. `attention_mask`, if given, is then
            `(batch, query_length or 1, positions)` over absolute positions
            and says which hold real tokens. With `is_causal`, query `i`
            sees positions `≤ cache_update_index + i`.
        cache_update_index: int or int tensor. The position of the first
            new token.
        mechanism_arguments: dict or None. More inputs of the mechanism for
            this call (Transformer-XL's projected relative positions).

    Returns:
        `(batch, query_length, output_dim)`; with a cache, the tuple
        `(output, new_cache)`.

    Example:

    >>> import numpy as np
    >>> layer = MultiHeadAttention(num_heads=2, head_dim=4)
    >>> tuple(layer(np.zeros((1, 3, 8), "float32")).shape)
    (1, 3, 8)
    >>> layer = MultiHeadAttention(num_heads=2, head_dim=4, attention="relative",
    ...                            attention_options={"max_distance": 8})
    >>> _ = layer(np.zeros((1, 3, 8), "float32"), is_causal=True)
    >>> tuple(layer.mechanism_weights["relative_key_embeddings"].shape)
    (17, 4)
    """

    def __init__(
        self,
        num_heads,
        head_dim,
        output_dim=None,
        attention="softmax",
        attention_options=None,
        dropout=0.0,
        use_bias=True,
        kernel_initializer="glorot_uniform",
        shared_query_key=False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.output_dim = output_dim
        self.attention = attention
        self.attention_options = dict(attention_options or {})
        check_options(attention, self.attention_options)
        self._call_options = call_options(attention, self.attention_options)
        self.dropout = dropout
        self.use_bias = use_bias
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.shared_query_key = shared_query_key
        self._mechanism = get_mechanism(attention)
        self.seed_generator = keras.random.SeedGenerator(seed=None)

        inner_dim = num_heads * head_dim
        self.query_dense = self._projection(inner_dim, "query")
        self.key_dense = None if shared_query_key else self._projection(inner_dim, "key")
        self.value_dense = self._projection(inner_dim, "value")
        self.output_dense = None
        self.mechanism_weights = {}

    def _projection(self, units, name):
        return Dense(
            units,
            use_bias=self.use_bias,
            kernel_initializer=clone_initializer(self.kernel_initializer),
            dtype=self.dtype_policy,
            name=name,
        )

    def build(self, query_shape, value_shape=None):
        value_shape = query_shape if value_shape is None else value_shape
        self.query_dense.build(query_shape)
        if self.key_dense is not None:
            self.key_dense.build(value_shape)
        self.value_dense.build(value_shape)
        output_dim = self.output_dim or query_shape[-1]
        self.output_dense = self._projection(output_dim, "output")
        self.output_dense.build(tuple(query_shape[:-1]) + (self.num_heads * self.head_dim,))
        weights = mechanism_weights(self.attention, self.num_heads, self.head_dim, self.attention_options)
        self.mechanism_weights = {
            name: self.add_weight(shape=shape, initializer=initializer, name=name)
            for name, (shape, initializer) in weights.items()
        }

    def _mechanism_arguments(self):
        """The options and weights every call passes to the mechanism."""
        return {**self._call_options, **self.mechanism_weights}

    def initial_cache(self, batch, max_length):
        """The empty decoding cache of this layer: the mechanism's
        `initial_cache` for its heads, options and compute dtype (see
        `attention.DecodingCache`)."""
        return get_decoding(self.attention).initial_cache(
            batch, max_length, self.num_heads, self.head_dim, self.compute_dtype, **self._call_options
        )

    def _split_heads(self, x):
        batch, length = ops.shape(x)[0], ops.shape(x)[1]
        return ops.reshape(x, (batch, length, self.num_heads, self.head_dim))

    def project_key_value(self, value):
        """`(key, value)` heads of `value` `(batch, key_length, dim)`, each
        `(batch, key_length, num_heads, head_dim)`: what `call(key_value=...)`
        takes."""
        key_dense = self.query_dense if self.shared_query_key else self.key_dense
        return self._split_heads(key_dense(value)), self._split_heads(self.value_dense(value))

    def call(
        self,
        query,
        value=None,
        attention_mask=None,
        is_causal=False,
        training=None,
        cache=None,
        cache_update_index=None,
        key_value=None,
        mechanism_arguments=None,
        key_lengths=None,
    ):
        arguments = {**self._mechanism_arguments(), **(mechanism_arguments or {})}
        missing = [name for name in mechanism_inputs(self.attention) if name not in arguments]
        if missing:
            raise ValueError(
                f"The '{self.attention}' attention mechanism needs {', '.join(missing)} with every call: "
                "pass mechanism_arguments={...}."
            )
        query_heads = self._split_heads(self.query_dense(query))
        mask = None if attention_mask is None else attention_mask[:, None, :, :]
        if key_lengths is not None and (attention_mask is not None or cache is not None):
            raise ValueError("key_lengths replaces attention_mask, for calls without a decoding cache.")
        if cache is not None:
            if value is not None or key_value is not None:
                raise ValueError("A decoding cache is only supported for self-attention (value=None).")
            if cache_update_index is None:
                raise ValueError("A decoding cache needs cache_update_index, the position of the first new token.")
            key_heads = query_heads if self.shared_query_key else self._split_heads(self.key_dense(query))
            attended, new_cache = get_decoding(self.attention).attend_with_cache(
                query_heads,
                key_heads,
                self._split_heads(self.value_dense(query)),
                cache,
                cache_update_index,
                attention_mask=mask,
                is_causal=is_causal,
                dropout_rate=self.dropout,
                training=bool(training),
                seed_generator=self.seed_generator,
                **arguments,
            )
        else:
            if key_value is None and value is None and self.shared_query_key:
                key_value = (query_heads, self._split_heads(self.value_dense(query)))
            elif key_value is None:
                key_value = self.project_key_value(query if value is None else value)
            elif value is not None:
                raise ValueError("Pass value or key_value, not both.")
            if key_lengths is not None and not takes_key_lengths(self.attention):  # the mask they imply
                mask, key_lengths = key_length_mask(key_lengths, ops.shape(key_value[0])[1]), None
            lengths_argument = {} if key_lengths is None else {"key_lengths": key_lengths}
            recorder = active_recorder()
            if recorder is not None and is_concrete(query_heads):  # inside `attention_maps`
                maps_mask = mask if key_lengths is None else key_length_mask(key_lengths, ops.shape(key_value[0])[1])
                probabilities = self._attention_probabilities(
                    query_heads, key_value[0], maps_mask, is_causal, arguments, recorder.hash_rounds
                )
                record_probabilities(recorder, self, probabilities)
            attended = self._mechanism(
                query_heads,
                *key_value,
                attention_mask=mask,
                is_causal=is_causal,
                dropout_rate=self.dropout,
                training=bool(training),
                seed_generator=self.seed_generator,
                **arguments,
                **lengths_argument,
            )
        batch, length = ops.shape(attended)[0], ops.shape(attended)[1]
        merged = ops.reshape(attended, (batch, length, self.num_heads * self.head_dim))
        output = self.output_dense(merged)
        if cache is not None:
            return output, new_cache
        return output

    def _attention_probabilities(self, query_heads, key_heads, mask, is_causal, arguments, hash_rounds):
        """This call's attention probabilities `(B, N, T, S)`, or per
        hashing round (`attention.attention_probabilities`). A mechanism that draws its
        randomness from the layer's seed generator (LSH rotations without a
        seed) draws here what the call itself then draws: the generator's
        state is put back."""
        state = keras.ops.copy(self.seed_generator.state.value)
        probabilities = attention_probabilities(
            self.attention, query_heads, key_heads, hash_rounds=hash_rounds, attention_mask=mask,
            is_causal=is_causal, seed_generator=self.seed_generator, **arguments,
        )
        self.seed_generator.state.assign(state)
        return probabilities

    def compute_output_shape(self, query_shape, value_shape=None):
        return tuple(query_shape[:-1]) + (self.output_dim or query_shape[-1],)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "head_dim": self.head_dim,
                "output_dim": self.output_dim,
                "attention": self.attention,
                "attention_options": self.attention_options,
                "dropout": self.dropout,
                "use_bias": self.use_bias,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "shared_query_key": self.shared_query_key,
            }
        )
        return config
