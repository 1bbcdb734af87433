"""The memory Transformer-XL carries from batch to batch of a token stream
(Dai et al., 2019, §3.2): the hidden states of the last `mem_len`
positions of every layer, kept in a non-trainable variable between the
calls of `fit` / `evaluate`, read at the start of a batch and written at
its end inside the task's graph (so Keras' compiled steps carry it on
every backend), without gradient.
"""

import keras
from keras import ops


class StreamMemory(keras.layers.Layer):
    """The memory carried between the batches of a token stream: a
    non-trainable `(batch_size, num_layers, mem_len, hidden_dim)` variable,
    zeros at the start of every stream (as `transformers` starts)."""

    def __init__(self, batch_size, num_layers, mem_len, hidden_dim, **kwargs):
        super().__init__(**kwargs)
        self.batch_size = batch_size
        self.memory_shape = (batch_size, num_layers, mem_len, hidden_dim)

    def build(self, input_shape=None):
        self.memory = self.add_weight(shape=self.memory_shape, initializer="zeros", trainable=False, name="memory")


class ReadStreamMemory(keras.layers.Layer):
    """In the task's graph: the memory a batch starts from — the carried
    one (`streams()` returns the task's `StreamMemory`, if any), zeros for
    rows marked `reset_memory`, and `mem_len` zero vectors when nothing is
    carried. The variable is not trainable, so no gradient reaches it."""

    def __init__(self, streams, num_layers, mem_len, hidden_dim, **kwargs):
        super().__init__(**kwargs)
        self.streams = streams
        self.memory_shape = (num_layers, mem_len, hidden_dim)

    def call(self, token_ids, reset_memory=None):
        streams = self.streams()
        if not streams:
            return ops.zeros((ops.shape(token_ids)[0],) + self.memory_shape, dtype=self.compute_dtype)
        stream_count, batch = streams[0].batch_size, token_ids.shape[0]
        if batch is not None and batch != stream_count:
            raise ValueError(
                f"The memory carried between calls holds {stream_count} streams; this batch has {batch} rows. "
                f"Call reset_memory({batch}) to start new streams."
            )
        memory = ops.cast(ops.convert_to_tensor(streams[0].memory), self.compute_dtype)
        if reset_memory is not None:
            keep = ops.logical_not(ops.cast(reset_memory, "bool"))[:, None, None, None]
            memory = ops.where(keep, memory, ops.zeros_like(memory))
        return memory

    def compute_output_spec(self, token_ids, reset_memory=None):
        return keras.KerasTensor((token_ids.shape[0],) + self.memory_shape, dtype=self.compute_dtype)


class WriteStreamMemory(keras.layers.Layer):
    """In the task's graph: keeps the memory a batch produced (the
    backbone's, already without gradient) for the next, when a
    `StreamMemory` is carried, and passes `outputs` through."""

    def __init__(self, streams, **kwargs):
        super().__init__(**kwargs)
        self.streams = streams

    def call(self, outputs, new_memory):
        streams = self.streams()
        if streams:
            variable = streams[0].memory
            variable.assign(ops.cast(new_memory, variable.dtype))
        return outputs

    def compute_output_spec(self, outputs, new_memory):
        return keras.KerasTensor(outputs.shape, dtype=outputs.dtype)
