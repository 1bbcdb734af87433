"""Axial position embeddings — Kitaev, Kaiser and Levskaya, 2020, "Reformer:
The Efficient Transformer" (ICLR 2020), as in trax and transformers'
`AxialPositionEmbeddings`.

A table of `n₁·n₂` learned positions factored into two small ones: with
`axial_pos_shape = (n₁, n₂)` and `axial_pos_embds_dim = (d₁, d₂)`,
`d₁ + d₂ = d`, position `t = r·n₂ + c` (`r = ⌊t/n₂⌋`, `c = t mod n₂`) has

    P_t = [ E¹_r ; E²_c ] ∈ R^d,    E¹ ∈ R^{n₁ × d₁},  E² ∈ R^{n₂ × d₂}

— the `(n₁, 1, d₁)` and `(1, n₂, d₂)` weights broadcast to `(n₁, n₂, ·)`,
concatenated along the features and flattened in row-major order: `n₁·d₁ +
n₂·d₂` parameters instead of `n₁·n₂·d` (Reformer enwik8: 128 × 512
positions, 1024 wide, 0.4 M instead of 67 M).

While training, transformers uses the whole table (the sequence length must
be `n₁·n₂`) and drops positions with `dropout2d` over the columns: for each
sequence and each column `c` the embeddings of all the positions `r·n₂ + c`
are zeroed together with probability `dropout` (the others are scaled by
`1 / (1 − dropout)`). At inference any `length ≤ n₁·n₂` positions may be
read, from any start (incremental decoding).
"""

import keras
import numpy as np
from keras import ops

from attention_zoo_keras.layers.initializers import clone_initializer
from attention_zoo_keras.registration import register


def _pair(value, name):
    try:
        pair = tuple(int(v) for v in value)
    except TypeError:
        raise ValueError(f"{name} must be a pair of positive integers; got {value!r}.") from None
    if len(pair) != 2 or min(pair) < 1 or any(int(v) != v for v in value):
        raise ValueError(f"{name} must be a pair of positive integers; got {value!r}.")
    return pair


@register
class AxialPositionEmbedding(keras.layers.Layer):
    """Returns the axial position embeddings of positions `start, …, start + length − 1`.

    Weights (transformers' `embeddings.position_embeddings.weights.{i}`
    have the same shapes and copy across unchanged):

    * `embeddings_0`: `(n₁, 1, d₁)`, the row embeddings (`weights.0`);
    * `embeddings_1`: `(1, n₂, d₂)`, the column embeddings (`weights.1`).

    Args:
        axial_pos_shape: tuple of two int. `(n₁, n₂)`; `n₁·n₂` is the
            largest number of positions (transformers'
            `config.axial_pos_shape`).
        axial_pos_embds_dim: tuple of two int. `(d₁, d₂)`, with `d₁ + d₂`
            the hidden size (`config.axial_pos_embds_dim`).
        dropout: float. The rate at which training drops whole columns of
            the table, per sequence (`config.hidden_dropout_prob`; 0
            disables).
        initializer: str or keras.initializers.Initializer or None. The
            initializer of both weights (`None`: `RandomNormal(stddev=1.0)`);
            transformers draws them from `N(0, axial_norm_std²)`,
            `axial_norm_std = 1`.
        seed: int or None. The seed of the dropout.

    Call args:
        inputs: tensor of shape `(batch, length)` or
            `(batch, length, d₁ + d₂)`. Token ids or hidden states; only the
            shape is used.
        start_index: int or int32 scalar tensor. The first position, for
            incremental decoding; 0 while training.
        training: bool or None. Whether dropout is active. While training,
            as in transformers, `length` must be `n₁·n₂`.

    Returns:
        `(1, length, d₁ + d₂)`, or `(batch, length, d₁ + d₂)` while
        training with dropout (each sequence drops its own columns); to be
        added to the token embeddings.

    Raises:
        ValueError: for a length longer than `n₁·n₂` (from `start_index`),
            for a length other than `n₁·n₂` (or a nonzero start) while
            training, and for hidden states whose width is not `d₁ + d₂`
            (checked where the length and start are static; positions
            beyond the table are not checked inside a compiled function).

    Example:

    >>> import numpy as np
    >>> layer = AxialPositionEmbedding(axial_pos_shape=(4, 8), axial_pos_embds_dim=(2, 6))
    >>> tuple(layer(np.zeros((2, 5), "int32")).shape)
    (1, 5, 8)
    >>> [tuple(w.shape) for w in layer.weights]
    [(4, 1, 2), (1, 8, 6)]
    >>> tuple(layer(np.zeros((2, 32), "int32"), training=True).shape)
    (1, 32, 8)
    """

    def __init__(
        self,
        axial_pos_shape,
        axial_pos_embds_dim,
        dropout=0.0,
        initializer=None,
        seed=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.axial_pos_shape = _pair(axial_pos_shape, "axial_pos_shape")
        self.axial_pos_embds_dim = _pair(axial_pos_embds_dim, "axial_pos_embds_dim")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1); got {dropout!r}.")
        self.dropout = float(dropout)
        self.initializer = keras.initializers.get(
            initializer if initializer is not None else keras.initializers.RandomNormal(stddev=1.0)
        )
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed)
        self.max_length = self.axial_pos_shape[0] * self.axial_pos_shape[1]
        self.hidden_dim = sum(self.axial_pos_embds_dim)

    def build(self, input_shape=None):
        if input_shape is not None and len(input_shape) == 3 and input_shape[-1] not in (None, self.hidden_dim):
            raise ValueError(
                f"The hidden states are {input_shape[-1]} wide, but axial_pos_embds_dim "
                f"{self.axial_pos_embds_dim} sums to {self.hidden_dim} (input shape {tuple(input_shape)})."
            )
        (rows, columns), (row_dim, column_dim) = self.axial_pos_shape, self.axial_pos_embds_dim
        self.embeddings_0 = self.add_weight(
            name="embeddings_0", shape=(rows, 1, row_dim), initializer=clone_initializer(self.initializer)
        )
        self.embeddings_1 = self.add_weight(
            name="embeddings_1", shape=(1, columns, column_dim), initializer=clone_initializer(self.initializer)
        )

    def _check_length(self, length, start_index, training):
        static_start = int(start_index) if isinstance(start_index, (int, np.integer)) else None
        if training:
            if isinstance(length, int) and length != self.max_length:
                raise ValueError(
                    f"While training, the sequence length must be the number of axial positions: got length "
                    f"{length}, but axial_pos_shape {self.axial_pos_shape} has {self.max_length} positions. "
                    f"Pad the sequences to {self.max_length} or change axial_pos_shape."
                )
            if static_start not in (None, 0):
                raise ValueError(f"While training, start_index must be 0; got {start_index}.")
        elif isinstance(length, int) and static_start is not None and static_start + length > self.max_length:
            raise ValueError(
                f"Positions {static_start} … {static_start + length - 1} (start_index {static_start}, length "
                f"{length}) do not fit the {self.max_length} positions of axial_pos_shape {self.axial_pos_shape}."
            )

    def call(self, inputs, start_index=0, training=None):
        length = inputs.shape[1] if inputs.shape[1] is not None else ops.shape(inputs)[1]
        self._check_length(length, start_index, training)
        columns = self.axial_pos_shape[1]
        positions = ops.cast(start_index, "int32") + ops.arange(length, dtype="int32")
        row_index, column_index = positions // columns, positions % columns
        table = ops.concatenate(
            [
                ops.take(self.embeddings_0[:, 0, :], row_index, axis=0),
                ops.take(self.embeddings_1[0], column_index, axis=0),
            ],
            axis=-1,
        )  # (length, d)
        table = ops.expand_dims(ops.cast(table, self.compute_dtype), 0)
        if training and self.dropout > 0.0:
            batch = ops.shape(inputs)[0]
            keep = keras.random.dropout(
                ops.ones((batch, columns), self.compute_dtype), self.dropout, seed=self.seed_generator
            )  # 0 or 1 / (1 − dropout), per sequence and column
            table = table * ops.expand_dims(ops.take(keep, column_index, axis=1), -1)
        return table

    def compute_output_shape(self, input_shape):
        return (1 if self.dropout == 0.0 else None, input_shape[1], self.hidden_dim)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "axial_pos_shape": self.axial_pos_shape,
                "axial_pos_embds_dim": self.axial_pos_embds_dim,
                "dropout": self.dropout,
                "initializer": keras.initializers.serialize(self.initializer),
                "seed": self.seed,
            }
        )
        return config
