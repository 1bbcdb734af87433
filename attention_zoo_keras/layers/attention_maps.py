"""Attention maps: the attention probabilities of every `MultiHeadAttention`
call in a model, recorded on request.

`attention_maps(model, inputs)` calls the model once, eagerly and without
dropout, while a recorder is active. Each `MultiHeadAttention` layer then
also computes its mechanism's probabilities from the queries, keys, mask and
options of that very call (`attention.attention_probabilities`: the
mechanism applied to one-hot values) and hands them to the recorder. With no
recorder active a layer only checks that none is, so normal calls, compiled
steps (which are never recorded) and their speed are unchanged. Decoding
steps with a cache are not recorded: call the model on the whole sequence.
"""

import contextlib

import keras
import numpy as np

_recorders = []  # the attention_maps calls in progress, innermost last


class Recorder(dict):
    """The maps of one `attention_maps` call, `{name: probabilities}`;
    `hash_rounds`: whether hashing mechanisms give each round's maps;
    `positions`: `None`, or where a model reordered its rows' positions
    (`layers.PermutePositions`), the `(batch, length)` input position at
    each index, by which the maps are put back in the inputs' order."""

    def __init__(self, hash_rounds):
        super().__init__()
        self.hash_rounds = hash_rounds
        self.positions = None

    def reorder_positions(self, order):
        """The model went on with `x[b, order[b, s]]` at index `s` of row `b`."""
        order = np.asarray(order)
        if self.positions is not None:
            order = np.take_along_axis(self.positions, order, axis=1)
        identity = (order == np.arange(order.shape[1])).all()
        self.positions = None if identity else order

    def in_input_order(self, probabilities):
        """`probabilities` (`(B, N, ..., T, S)`) with its query and key axes
        in the inputs' order where they span the reordered positions."""
        if self.positions is None or probabilities.shape[-2:] != (self.positions.shape[1],) * 2:
            return probabilities
        index = np.argsort(self.positions, axis=1)  # the index each input position went to
        batch, length = index.shape
        leading = (batch,) + (1,) * (probabilities.ndim - 3)
        probabilities = np.take_along_axis(probabilities, index.reshape(leading + (length, 1)), axis=-2)
        return np.take_along_axis(probabilities, index.reshape(leading + (1, length)), axis=-1)


def active_recorder():
    """The `Recorder` of the innermost `attention_maps` call in progress,
    or `None` (the usual case: nothing is recorded)."""
    return _recorders[-1] if _recorders else None


def record_probabilities(recorder, layer, probabilities):
    """Adds a layer call's probabilities (`(B, N, T, S)`, or per hashing
    round `(B, N, rounds, T, S)`) to `recorder` under
    the layer's path (a second call of the same layer gets `#2`, …). The
    layer records only concrete (eager) calls: a compiled step is not
    recorded."""
    name, calls = layer.path, 1
    while name in recorder:
        calls += 1
        name = f"{layer.path}#{calls}"
    probabilities = np.asarray(keras.ops.convert_to_numpy(probabilities), dtype="float32")
    recorder[name] = recorder.in_input_order(probabilities)


@contextlib.contextmanager
def _recording(hash_rounds):
    recorder = Recorder(hash_rounds)
    _recorders.append(recorder)
    try:
        yield recorder
    finally:
        _recorders.pop()


def attention_maps(model, inputs, hash_rounds=False, **call_arguments):
    """The attention probabilities of every `MultiHeadAttention` call that
    `model(inputs, training=False, **call_arguments)` makes.

    Args:
        model: keras.Model or keras.layers.Layer. Any model or layer built
            from this library's layers (a backbone, a task, a block).
        inputs: tensor or dict of tensors. What `model` is called on (for a
            task, its preprocessor's output: `task.preprocessor(texts)`
            where it has one; of an `(x, y, sample_weight)` tuple, as a
            language model's preprocessor gives, the features `x`).
        hash_rounds: bool. For LSH attention, each hashing round's weights,
            `(batch, heads, rounds, queries, keys)`, instead of their
            combination.
        **call_arguments: dict. Further arguments of the call.

    Returns:
        `{layer path: float32 array (batch, heads, queries, keys)}` in call
        order: each row holds the weights of one query over the keys (0
        for keys it may not attend to; for LSH attention the combination
        of the hash rounds). The model's outputs are not returned.

    Example:

    >>> import numpy as np
    >>> import attention_zoo_keras as azk
    >>> backbone = azk.models.BertBackbone(vocabulary_size=50, num_layers=2, num_heads=2,
    ...                                    hidden_dim=8, intermediate_dim=16)
    >>> inputs = {"token_ids": np.array([[5, 6, 7, 0]]), "segment_ids": np.zeros((1, 4), "int32"),
    ...           "padding_mask": np.array([[1, 1, 1, 0]])}
    >>> maps = azk.attention_maps(backbone, inputs)
    >>> [probabilities.shape for probabilities in maps.values()]
    [(1, 2, 4, 4), (1, 2, 4, 4)]
    """
    if isinstance(inputs, tuple) and inputs and isinstance(inputs[0], dict):
        inputs = inputs[0]  # a preprocessor's (x, y, sample_weight)
    with _recording(hash_rounds) as recorder:
        model(inputs, training=False, **call_arguments)
    return dict(recorder)
