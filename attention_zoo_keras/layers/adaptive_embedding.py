"""Adaptive input embedding (Baevski & Auli, 2019, "Adaptive Input
Representations for Neural Language Modeling"), as Transformer-XL (Dai et
al., 2019) uses it.

The vocabulary is split at `cutoffs` c₁ < … < c_K into clusters
Vᵢ = [cᵢ, cᵢ₊₁) (c₀ = 0, c_{K+1} = |V|), ordered by frequency. Cluster i has
its own table Eᵢ `(|Vᵢ|, d / kⁱ)` (d the embedding width, k = `div_val`) and
projection Pᵢ `(d / kⁱ, d_out)`, so rare words get narrower vectors:

    e(w) = √d_out · E_i[w − cᵢ] Pᵢ        for w ∈ Vᵢ

With k = 1 there is a single table E `(|V|, d)` over the whole vocabulary and
a single projection P, which is the identity (absent) when d_out = d:

    e(w) = √d_out · E[w] P
"""

import math

import keras
from keras import ops

from attention_zoo_keras.backend_support import variables_in_their_own_dtype
from attention_zoo_keras.layers.initializers import clone_initializer
from attention_zoo_keras.registration import register


def check_adaptive_arguments(vocabulary_size, embedding_dim, cutoffs, div_val, layer_name):
    """Validates the arguments shared by `AdaptiveEmbedding` and
    `AdaptiveLogSoftmax`; returns `(cutoffs as a list of ints, div_val as
    an int)`."""
    if isinstance(vocabulary_size, bool) or not isinstance(vocabulary_size, int) or vocabulary_size < 1:
        raise ValueError(f"{layer_name}: vocabulary_size must be a positive integer, got {vocabulary_size!r}.")
    if isinstance(embedding_dim, bool) or not isinstance(embedding_dim, int) or embedding_dim < 1:
        raise ValueError(f"{layer_name}: embedding_dim must be a positive integer, got {embedding_dim!r}.")
    if cutoffs is None:
        cutoffs = ()
    try:
        cutoffs = list(cutoffs)
    except TypeError:
        raise ValueError(f"{layer_name}: cutoffs must be a sequence of integers, got {cutoffs!r}.") from None
    for cutoff in cutoffs:
        if isinstance(cutoff, bool) or not isinstance(cutoff, int):
            raise ValueError(f"{layer_name}: cutoffs must be integers, got {cutoffs!r}.")
    bounds = [0] + cutoffs + [vocabulary_size]
    if any(low >= high for low, high in zip(bounds, bounds[1:])):
        raise ValueError(
            f"{layer_name}: cutoffs must be strictly increasing, above 0 and below "
            f"vocabulary_size={vocabulary_size}, got {cutoffs!r}."
        )
    if isinstance(div_val, bool) or not isinstance(div_val, (int, float)) or div_val != int(div_val) or div_val < 1:
        raise ValueError(f"{layer_name}: div_val must be an integer >= 1, got {div_val!r}.")
    div_val = int(div_val)
    if div_val > 1 and embedding_dim // div_val ** len(cutoffs) < 1:
        raise ValueError(
            f"{layer_name}: embedding_dim={embedding_dim} // div_val**{len(cutoffs)} is 0: the last "
            f"cluster would have no width. Use a larger embedding_dim or a smaller div_val."
        )
    return cutoffs, div_val


def cluster_bounds(vocabulary_size, cutoffs):
    """`[(start, stop), …]`: the id range of each cluster."""
    bounds = [0] + list(cutoffs) + [vocabulary_size]
    return list(zip(bounds, bounds[1:]))


@register
class AdaptiveEmbedding(keras.layers.Layer):
    """Token embedding with narrower vectors for rarer clusters of the
    vocabulary, projected to a common width and scaled by √output_dim.

    Reproduces `AdaptiveEmbedding` of Hugging Face `transformers`'
    Transformer-XL (including the `√d_proj` scale). Every cluster is computed
    for every token with static shapes (ids clipped into the cluster's range,
    gathered, projected, and kept only where the id belongs to it), so the
    layer runs under `jax.jit`, `tf.function` and torch alike.

    Args:
        vocabulary_size: int. The number of token ids.
        embedding_dim: int. The width `d` of the first (most frequent)
            cluster's table.
        output_dim: int. The width of the output (`d_proj`, the model
            width).
        cutoffs: tuple of int. Increasing ids
            `0 < c₁ < … < c_K < vocabulary_size` where a new cluster starts;
            `()` for one cluster.
        div_val: int. `k`; cluster i's table is `embedding_dim // k**i`
            wide. With `div_val == 1` there is a single table over the whole
            vocabulary, whatever the cutoffs.
        embeddings_initializer: str or keras.initializers.Initializer or
            None. The initializer of the tables (`None`:
            `RandomNormal(stddev=0.02)`, Transformer-XL's).
        projection_initializer: str or keras.initializers.Initializer or
            None. The initializer of the projections (`None`:
            `RandomNormal(stddev=0.01)`, Transformer-XL's `proj_init_std`).

    Attributes (after `build`):
        embeddings: list of keras.Variable. The tables in cluster order;
            cluster i's (named `embeddings_{i}`) is `(stop_i − start_i, d_i)`
            with `d_i = embedding_dim // div_val**i`. With `div_val == 1`
            one table `(vocabulary_size, embedding_dim)`.
        projections: list of keras.Variable or None. One entry per table:
            the projection variable `projection_{i}` of shape
            `(d_i, output_dim)` (Keras orientation, `e = E[w] P`;
            `transformers` stores its transpose `(d_proj, d_i)`), or `None`
            where there is none (`div_val == 1` and
            `output_dim == embedding_dim`).

    Call args:
        token_ids: int tensor of any shape. The token ids.

    Returns:
        `(*token_ids.shape, output_dim)` in the layer's compute dtype.

    Example:

    >>> import numpy as np
    >>> embedding = AdaptiveEmbedding(20, 8, output_dim=6, cutoffs=(5, 10), div_val=2)
    >>> tuple(embedding(np.array([[0, 5, 19]])).shape)
    (1, 3, 6)
    >>> [tuple(table.shape) for table in embedding.embeddings]
    [(5, 8), (5, 4), (10, 2)]
    >>> [tuple(projection.shape) for projection in embedding.projections]
    [(8, 6), (4, 6), (2, 6)]
    """

    def __init__(
        self,
        vocabulary_size,
        embedding_dim,
        output_dim,
        cutoffs=(),
        div_val=1,
        embeddings_initializer=None,
        projection_initializer=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        cutoffs, div_val = check_adaptive_arguments(
            vocabulary_size, embedding_dim, cutoffs, div_val, type(self).__name__
        )
        if isinstance(output_dim, bool) or not isinstance(output_dim, int) or output_dim < 1:
            raise ValueError(f"{type(self).__name__}: output_dim must be a positive integer, got {output_dim!r}.")
        self.vocabulary_size = vocabulary_size
        self.embedding_dim = embedding_dim
        self.output_dim = output_dim
        self.cutoffs = cutoffs
        self.div_val = div_val
        self.embeddings_initializer = keras.initializers.get(
            embeddings_initializer or keras.initializers.RandomNormal(stddev=0.02)
        )
        self.projection_initializer = keras.initializers.get(
            projection_initializer or keras.initializers.RandomNormal(stddev=0.01)
        )
        if div_val == 1:
            self.cluster_bounds = [(0, vocabulary_size)]
            self.cluster_dims = [embedding_dim]
        else:
            self.cluster_bounds = cluster_bounds(vocabulary_size, cutoffs)
            self.cluster_dims = [embedding_dim // div_val**i for i in range(len(self.cluster_bounds))]
        self.embeddings = None
        self.projections = None

    def build(self, token_ids_shape=None):
        embeddings, projections = [], []
        for i, ((start, stop), dim) in enumerate(zip(self.cluster_bounds, self.cluster_dims)):
            embeddings.append(
                self.add_weight(
                    shape=(stop - start, dim),
                    initializer=clone_initializer(self.embeddings_initializer),
                    name=f"embeddings_{i}",
                )
            )
            if self.div_val == 1 and self.output_dim == self.embedding_dim:
                projections.append(None)
            else:
                projections.append(
                    self.add_weight(
                        shape=(dim, self.output_dim),
                        initializer=clone_initializer(self.projection_initializer),
                        name=f"projection_{i}",
                    )
                )
        self.embeddings = embeddings
        self.projections = projections

    def call(self, token_ids):
        token_ids = ops.cast(token_ids, "int32")
        dtype = self.compute_dtype
        # Rows are gathered from the tables in their own dtype, then cast: under
        # mixed precision the tables' gradients are summed in float32 (see
        # `layers.embedding`).
        with variables_in_their_own_dtype():
            tables = [ops.convert_to_tensor(table) for table in self.embeddings]
        if len(tables) == 1:
            output = ops.cast(ops.take(tables[0], token_ids, axis=0), dtype)
            if self.projections[0] is not None:
                output = ops.matmul(output, ops.cast(self.projections[0], dtype))
        else:
            output = None
            for (start, stop), table, projection in zip(self.cluster_bounds, tables, self.projections):
                local_ids = ops.clip(token_ids - start, 0, stop - start - 1)
                cluster = ops.matmul(
                    ops.cast(ops.take(table, local_ids, axis=0), dtype), ops.cast(projection, dtype)
                )
                member = ops.expand_dims(ops.logical_and(token_ids >= start, token_ids < stop), -1)
                cluster = ops.where(member, cluster, ops.zeros_like(cluster))
                output = cluster if output is None else output + cluster
        return output * ops.cast(math.sqrt(self.output_dim), output.dtype)

    def compute_output_shape(self, token_ids_shape):
        return tuple(token_ids_shape) + (self.output_dim,)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "vocabulary_size": self.vocabulary_size,
                "embedding_dim": self.embedding_dim,
                "output_dim": self.output_dim,
                "cutoffs": list(self.cutoffs),
                "div_val": self.div_val,
                "embeddings_initializer": keras.initializers.serialize(self.embeddings_initializer),
                "projection_initializer": keras.initializers.serialize(self.projection_initializer),
            }
        )
        return config
