"""Adaptive softmax (Grave et al., 2017, "Efficient softmax approximation for
GPUs") with Transformer-XL's per-cluster projections (Dai et al., 2019).

The vocabulary is split at `cutoffs` c₁ < … < c_K into a shortlist
V₀ = [0, c₁) and tail clusters Vᵢ = [cᵢ, cᵢ₊₁) (c_{K+1} = |V|). Each cluster
i has an output table Wᵢ `(|Vᵢ|, dᵢ)`, a bias bᵢ and a projection Pᵢ
`(d_in, dᵢ)` (dᵢ = d / kⁱ, k = `div_val`; Pᵢ is the identity where absent).
The head scores the shortlist and one "cluster" logit per tail cluster
(weights C `(K, d)`, bias c):

    head(h)  = log_softmax([h P₀ W₀ᵀ + b₀ ; h P₀ Cᵀ + c])
    log p(w) = head(h)[w]                                   for w ∈ V₀
    log p(w) = head(h)[c₁ + i − 1]
               + log_softmax(h Pᵢ Wᵢᵀ + bᵢ)[w − cᵢ]          for w ∈ Vᵢ, i ≥ 1

With `div_val == 1` a single table W `(|V|, d)` and bias `(|V|,)` over the
whole vocabulary are sliced per cluster (each cluster still has its own
projection). Without cutoffs it is a plain (projected) log-softmax,
`log_softmax(h P₀ Wᵀ + b)`.
"""

import keras
from keras import ops

from attention_zoo_keras.layers.adaptive_embedding import AdaptiveEmbedding
from attention_zoo_keras.layers.adaptive_embedding import check_adaptive_arguments
from attention_zoo_keras.layers.adaptive_embedding import cluster_bounds
from attention_zoo_keras.layers.initializers import clone_initializer
from attention_zoo_keras.registration import register


def _float32_policy(dtype):
    """The layer's dtype policy: a mixed policy is replaced by its variable
    dtype, so the layer's own weights are never read at reduced precision
    and inputs are not cast down on the way in."""
    policy = keras.dtype_policies.get(dtype)
    if type(policy) is keras.dtype_policies.DTypePolicy and policy.compute_dtype != policy.variable_dtype:
        return keras.dtype_policies.DTypePolicy(policy.variable_dtype)
    return policy


@register
class AdaptiveLogSoftmax(keras.layers.Layer):
    """Log-probabilities over a large vocabulary from a shortlist head and
    projected tail clusters.

    Reproduces `ProjectedAdaptiveLogSoftmax` of Hugging Face `transformers`'
    Transformer-XL (its `forward` without labels, i.e. tail cluster i's
    probability is head entry `cutoffs[0] + i − 1`), and
    `torch.nn.AdaptiveLogSoftmaxWithLoss.log_prob` when the projections are
    chosen to match. Always computed in float32: a mixed dtype policy is
    replaced by its variable dtype (as Keras advises for a final softmax)
    and every product is cast to float32.

    Args:
        vocabulary_size: int. The number of classes (token ids).
        embedding_dim: int. The width `d` of the first cluster's output
            table (and of the cluster weights).
        input_dim: int. The width of the hidden states (`d_proj`, the model
            width).
        cutoffs: tuple of int. Increasing ids
            `0 < c₁ < … < c_K < vocabulary_size` starting each tail cluster;
            `()` for a plain log-softmax.
        div_val: int. `k`; cluster i's table is `embedding_dim // k**i`
            wide. With `div_val == 1` one table over the whole vocabulary.
        tied_embedding: AdaptiveEmbedding or None. An embedding (same
            `vocabulary_size`, `embedding_dim`, `cutoffs`, `div_val`) whose
            tables are used as the output tables (Press & Wolf, 2017). The
            layer holds a reference to it (as `TiedLMHead` does), so its
            variables are not created twice; it is built here if it is not
            yet.
        tie_projections: list of bool or None. One per cluster
            (`len(cutoffs) + 1`): where true, cluster i's projection is the
            embedding's, transposed (`h Pᵢ = h P_embᵀ` with the embedding's
            `projections[i]`, or `projections[0]` when `div_val == 1`; the
            embedding's `output_dim` must be `input_dim`). Needs
            `tied_embedding`; ignored where a cluster has no projection.
        embeddings_initializer: str or keras.initializers.Initializer or
            None. The initializer of the untied output tables and of the
            cluster weights (`None`: `RandomNormal(stddev=0.02)`).
        projection_initializer: str or keras.initializers.Initializer or
            None. The initializer of the untied projections (`None`:
            `RandomNormal(stddev=0.01)`). Biases start at 0.

    Weights (float32 under a mixed policy; `i` is the cluster):
        `cluster_weight` `(len(cutoffs), embedding_dim)` and `cluster_bias`
            `(len(cutoffs),)`: the head's tail-cluster logits (only with
            cutoffs).
        `output_embeddings_{i}` `(stop_i − start_i, d_i)` (untied only; one
            `(vocabulary_size, embedding_dim)` table when `div_val == 1`).
        `output_bias_{i}` `(stop_i − start_i,)` (one `(vocabulary_size,)` when
            `div_val == 1`); always the layer's own.
        `projection_{i}` `(input_dim, d_i)`, applied as `h Pᵢ` (the same
            orientation as `transformers`' `out_projs[i]`): for every cluster
            when `div_val > 1`, else only when `input_dim != embedding_dim`;
            absent where tied.

    Attributes (after `build`):
        output_embeddings: list of keras.Variable. The output tables in
            cluster order (the tied embedding's own variables when tied).
        output_biases: list of keras.Variable. The bias variables.
        projections: list of keras.Variable or None. Per cluster the
            layer's own projection variable, or `None` where the cluster
            has none (tied, or no projection); `projection_kernel(i)` gives
            the matrix actually applied.
        cluster_weight, cluster_bias: keras.Variable or None. The head's
            cluster logits.

    Call args:
        hidden: tensor of shape `(..., input_dim)`. The hidden states.

    Returns:
        float32 log-probabilities `(..., vocabulary_size)`.

    Example:

    >>> import numpy as np
    >>> softmax = AdaptiveLogSoftmax(20, 8, input_dim=6, cutoffs=(5, 10), div_val=2)
    >>> log_probs = softmax(np.zeros((2, 3, 6), "float32"))
    >>> tuple(log_probs.shape)
    (2, 3, 20)
    >>> bool(np.allclose(np.exp(keras.ops.convert_to_numpy(log_probs)).sum(-1), 1.0, atol=1e-5))
    True
    >>> embedding = AdaptiveEmbedding(20, 8, output_dim=6, cutoffs=(5, 10), div_val=2)
    >>> tied = AdaptiveLogSoftmax(20, 8, 6, (5, 10), div_val=2, tied_embedding=embedding,
    ...                           tie_projections=[False, True, True])
    >>> tied.build((None, 6))
    >>> tied.output_embeddings[1] is embedding.embeddings[1]
    True
    """

    def __init__(
        self,
        vocabulary_size,
        embedding_dim,
        input_dim,
        cutoffs=(),
        div_val=1,
        tied_embedding=None,
        tie_projections=None,
        embeddings_initializer=None,
        projection_initializer=None,
        **kwargs,
    ):
        kwargs["dtype"] = _float32_policy(kwargs.get("dtype"))
        super().__init__(**kwargs)
        name = type(self).__name__
        cutoffs, div_val = check_adaptive_arguments(vocabulary_size, embedding_dim, cutoffs, div_val, name)
        if isinstance(input_dim, bool) or not isinstance(input_dim, int) or input_dim < 1:
            raise ValueError(f"{name}: input_dim must be a positive integer, got {input_dim!r}.")
        num_clusters = len(cutoffs) + 1
        if tie_projections is None:
            tie_projections = [False] * num_clusters
        tie_projections = [bool(tie) for tie in tie_projections]
        if len(tie_projections) != num_clusters:
            raise ValueError(
                f"{name}: tie_projections needs one boolean per cluster (len(cutoffs) + 1 = {num_clusters}), "
                f"got {len(tie_projections)}."
            )
        self.vocabulary_size = vocabulary_size
        self.embedding_dim = embedding_dim
        self.input_dim = input_dim
        self.cutoffs = cutoffs
        self.div_val = div_val
        self.tie_projections = tie_projections
        self.embeddings_initializer = keras.initializers.get(
            embeddings_initializer or keras.initializers.RandomNormal(stddev=0.02)
        )
        self.projection_initializer = keras.initializers.get(
            projection_initializer or keras.initializers.RandomNormal(stddev=0.01)
        )
        self.cluster_bounds = cluster_bounds(vocabulary_size, cutoffs)
        self.cluster_dims = [
            embedding_dim if div_val == 1 else embedding_dim // div_val**i for i in range(num_clusters)
        ]
        self.has_projection = div_val > 1 or input_dim != embedding_dim
        if tied_embedding is not None:
            self._check_tied_embedding(tied_embedding)
            if not tied_embedding.built:
                # Built here rather than in `build`, which runs inside this
                # layer's name scope: its variables keep their own paths.
                tied_embedding.build()
        elif any(tie_projections):
            raise ValueError(f"{name}: tie_projections needs a tied_embedding to take the projections from.")
        self.tied_embedding = tied_embedding
        self._own_output_embeddings = None
        self.output_biases = None
        self.projections = None
        self.cluster_weight = None
        self.cluster_bias = None

    def _check_tied_embedding(self, embedding):
        name = type(self).__name__
        if not isinstance(embedding, AdaptiveEmbedding):
            raise ValueError(f"{name}: tied_embedding must be an AdaptiveEmbedding, got {type(embedding).__name__}.")
        ours = (self.vocabulary_size, self.embedding_dim, list(self.cutoffs), self.div_val)
        theirs = (embedding.vocabulary_size, embedding.embedding_dim, list(embedding.cutoffs), embedding.div_val)
        if ours != theirs:
            raise ValueError(
                f"{name}: the tied embedding's (vocabulary_size, embedding_dim, cutoffs, div_val) = {theirs} "
                f"differ from this layer's {ours}."
            )
        if self.has_projection and any(self.tie_projections) and embedding.output_dim != self.input_dim:
            raise ValueError(
                f"{name}: tied projections need the embedding's output_dim ({embedding.output_dim}) to equal "
                f"input_dim ({self.input_dim})."
            )

    def build(self, hidden_shape=None):
        if hidden_shape is not None and hidden_shape[-1] not in (None, self.input_dim):
            raise ValueError(
                f"{type(self).__name__}: hidden states are {hidden_shape[-1]} wide, input_dim is {self.input_dim}."
            )
        embedding = self.tied_embedding
        num_tails = len(self.cutoffs)
        if num_tails:
            self.cluster_weight = self.add_weight(
                shape=(num_tails, self.embedding_dim),
                initializer=clone_initializer(self.embeddings_initializer),
                name="cluster_weight",
            )
            self.cluster_bias = self.add_weight(shape=(num_tails,), initializer="zeros", name="cluster_bias")
        tables = [(0, self.vocabulary_size)] if self.div_val == 1 else self.cluster_bounds
        own_tables, output_biases = [], []
        for i, (start, stop) in enumerate(tables):
            if embedding is None:
                own_tables.append(
                    self.add_weight(
                        shape=(stop - start, self.cluster_dims[i]),
                        initializer=clone_initializer(self.embeddings_initializer),
                                name=f"output_embeddings_{i}",
                    )
                )
            output_biases.append(
                self.add_weight(shape=(stop - start,), initializer="zeros", name=f"output_bias_{i}")
            )
        projections = []
        for i, dim in enumerate(self.cluster_dims):
            if not self.has_projection or self.tie_projections[i]:
                projections.append(None)
            else:
                projections.append(
                    self.add_weight(
                        shape=(self.input_dim, dim),
                        initializer=clone_initializer(self.projection_initializer),
                                name=f"projection_{i}",
                    )
                )
        self._own_output_embeddings = None if embedding is not None else own_tables
        self.output_biases = output_biases
        self.projections = projections

    @property
    def output_embeddings(self):
        """The output tables in cluster order (one when `div_val == 1`): the
        tied embedding's variables themselves, or this layer's own. Never
        stored on this layer, so Keras tracks tied variables once, as the
        embedding's."""
        if self.tied_embedding is not None:
            return list(self.tied_embedding.embeddings) if self.tied_embedding.built else None
        return self._own_output_embeddings

    def projection_kernel(self, i):
        """The matrix cluster `i`'s hidden states are multiplied by,
        `(input_dim, d_i)` (`h Pᵢ`), or `None` where there is no projection."""
        if not self.has_projection:
            return None
        if self.tie_projections[i]:
            source = self.tied_embedding.projections[0 if self.div_val == 1 else i]
            return ops.transpose(source)
        return self.projections[i]

    def _cluster_logits(self, hidden, i, table, bias):
        kernel = self.projection_kernel(i)
        if kernel is not None:
            hidden = ops.matmul(hidden, ops.cast(kernel, "float32"))
        return ops.matmul(hidden, ops.transpose(table)) + bias

    def call(self, hidden):
        hidden = ops.cast(hidden, "float32")
        tables = [ops.cast(table, "float32") for table in self.output_embeddings]
        biases = [ops.cast(bias, "float32") for bias in self.output_biases]
        if self.div_val == 1:
            tables = [tables[0][start:stop] for start, stop in self.cluster_bounds]
            biases = [biases[0][start:stop] for start, stop in self.cluster_bounds]
        if not self.cutoffs:
            return ops.log_softmax(self._cluster_logits(hidden, 0, tables[0], biases[0]), axis=-1)
        head_table = ops.concatenate([tables[0], ops.cast(self.cluster_weight, "float32")], axis=0)
        head_bias = ops.concatenate([biases[0], ops.cast(self.cluster_bias, "float32")], axis=0)
        head = ops.log_softmax(self._cluster_logits(hidden, 0, head_table, head_bias), axis=-1)
        shortlist = self.cutoffs[0]
        pieces = [head[..., :shortlist]]
        for i in range(1, len(self.cluster_bounds)):
            tail = ops.log_softmax(self._cluster_logits(hidden, i, tables[i], biases[i]), axis=-1)
            # Tail cluster i's probability is head entry cutoffs[0] + i - 1 (transformers' order).
            pieces.append(head[..., shortlist + i - 1 : shortlist + i] + tail)
        return ops.concatenate(pieces, axis=-1)

    def token_log_probabilities(self, hidden, token_ids):
        """`log p(token_ids | hidden)`, shape `token_ids.shape` (= `hidden`'s
        leading shape). Computes the full distribution with `call` and
        gathers from it, so it costs as much as `call` (no saving from
        skipping the tail clusters the tokens do not fall in)."""
        log_probs = self(hidden)
        token_ids = ops.expand_dims(ops.cast(token_ids, "int32"), -1)
        return ops.squeeze(ops.take_along_axis(log_probs, token_ids, axis=-1), -1)

    def compute_output_shape(self, hidden_shape):
        return tuple(hidden_shape[:-1]) + (self.vocabulary_size,)

    def compute_output_spec(self, hidden):
        return keras.KerasTensor(self.compute_output_shape(hidden.shape), dtype="float32")

    def get_config(self):
        if self.tied_embedding is not None:
            raise NotImplementedError(
                f"{type(self).__name__} tied to an embedding cannot be serialized on its own (like TiedLMHead): "
                "the model that owns both rebuilds it from its embedding."
            )
        config = super().get_config()
        config.update(
            {
                "vocabulary_size": self.vocabulary_size,
                "embedding_dim": self.embedding_dim,
                "input_dim": self.input_dim,
                "cutoffs": list(self.cutoffs),
                "div_val": self.div_val,
                "tie_projections": list(self.tie_projections),
                "embeddings_initializer": keras.initializers.serialize(self.embeddings_initializer),
                "projection_initializer": keras.initializers.serialize(self.projection_initializer),
            }
        )
        return config
