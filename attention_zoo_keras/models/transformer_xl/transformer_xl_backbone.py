"""Transformer-XL (Dai et al., 2019, "Transformer-XL: Attentive Language
Models Beyond a Fixed-Length Context"): a decoder-only Transformer whose
blocks attend over a memory of the previous segment's hidden states, with
relative positions.

    h⁰ = Dropout(AdaptiveEmb(x))
    h^l = Block_l(h^{l−1}, memory m^{l−1}, R)          l = 1..L
    m'^{l−1} = StopGradient([m^{l−1}; h^{l−1}])[−mem_len:]

`R` holds the sinusoidal encodings of the distances `0 … S − 1` between a
query and the `S = memory + segment` keys (clamped at `clamp_len`), shared
by all blocks; each block projects it (`TransformerXLBlock`). The memory
`m^{l−1}` is what block l attended over besides the segment: the inputs of
block l at the previous segment's last `mem_len` positions, carried
without gradient (§3.2).
"""

import keras
import numpy as np
from keras import ops

from attention_zoo_keras.attention.xl import xl_attention_mask
from attention_zoo_keras.layers.adaptive_embedding import AdaptiveEmbedding
from attention_zoo_keras.layers.block_stack import block_stack
from attention_zoo_keras.layers.initializers import clone_initializer
from attention_zoo_keras.models.backbone import Backbone
from attention_zoo_keras.models.input_validation import check_id_range
from attention_zoo_keras.models.transformer_xl.transformer_xl_block import TransformerXLBlock
from attention_zoo_keras.registration import register


def distance_encodings(num_distances, hidden_dim, clamp_len=0):
    """`(num_distances, hidden_dim)` float32 sinusoidal encodings of the
    distances `0 … num_distances − 1`, each clamped at `clamp_len` if it is
    positive: `[sin(d ω); cos(d ω)]` with `ω_k = 10000^(−2k/hidden_dim)`
    (the concatenated layout of `layers.sinusoidal_position_embedding`),
    computed in float32 like the authors' code.

    >>> import keras
    >>> keras.ops.convert_to_numpy(distance_encodings(3, 2, clamp_len=1)).astype("float64").round(4).tolist()
    [[0.0, 1.0], [0.8415, 0.5403], [0.8415, 0.5403]]
    """
    distances = ops.arange(num_distances, dtype="float32")
    if clamp_len > 0:
        distances = ops.minimum(distances, float(clamp_len))
    frequencies = ops.convert_to_tensor(
        (1.0 / 10000.0 ** (np.arange(0, hidden_dim, 2, dtype="float32") / hidden_dim)).astype("float32")
    )
    angles = distances[:, None] * frequencies[None, :]
    return ops.concatenate([ops.sin(angles), ops.cos(angles)], axis=-1)


@register
class RelativePositions(keras.layers.Layer):
    """What every block of a Transformer-XL pass shares: the distance
    encodings and the attention mask.

    `call(x, memory)` with the segment `x` `(batch, length, hidden_dim)` and
    the memory `(batch, num_layers, memory_length, hidden_dim)` returns the
    encodings of distances `0 … memory_length + length − 1`
    (`distance_encodings`) and the attention mask `(1, length,
    memory_length + length)` (`attention.xl.xl_attention_mask`: causal,
    and with `same_length` a sliding window of `mem_len` keys).
    """

    def __init__(self, hidden_dim, clamp_len, attention_span=None, **kwargs):
        super().__init__(**kwargs)
        self.hidden_dim = hidden_dim
        self.clamp_len = clamp_len
        self.attention_span = attention_span

    def call(self, x, memory):
        length = ops.shape(x)[1]
        num_keys = ops.shape(memory)[2] + length
        encodings = ops.cast(distance_encodings(num_keys, self.hidden_dim, self.clamp_len), self.compute_dtype)
        return encodings, xl_attention_mask(length, num_keys, attention_span=self.attention_span)[None]

    def compute_output_spec(self, x, memory):
        encodings = keras.KerasTensor((None, self.hidden_dim), dtype=self.compute_dtype)
        return encodings, keras.KerasTensor((1, x.shape[1], None), dtype="bool")

    def get_config(self):
        config = super().get_config()
        config.update(
            {"hidden_dim": self.hidden_dim, "clamp_len": self.clamp_len, "attention_span": self.attention_span}
        )
        return config


@register
class SharedRelativeBiases(keras.layers.Layer):
    """The content and position biases u, v shared by every block
    (Transformer-XL with `untie_r` off): `call(x)` returns `(u, v)`, each
    `(num_heads, head_dim)`; `x` only places the layer in a graph."""

    def __init__(self, num_heads, head_dim, **kwargs):
        super().__init__(**kwargs)
        self.num_heads = num_heads
        self.head_dim = head_dim

    def build(self, input_shape=None):
        shape = (self.num_heads, self.head_dim)
        self.content_bias = self.add_weight(shape=shape, initializer="zeros", name="content_bias")
        self.position_bias = self.add_weight(shape=shape, initializer="zeros", name="position_bias")

    def call(self, x):
        return ops.convert_to_tensor(self.content_bias), ops.convert_to_tensor(self.position_bias)

    def compute_output_spec(self, x):
        # One KerasTensor per output: a functional graph identifies a tensor
        # by the object, so returning one spec twice would wire both u and v
        # to the second output.
        shape = (self.num_heads, self.head_dim)
        return (
            keras.KerasTensor(shape, dtype=self.variable_dtype),
            keras.KerasTensor(shape, dtype=self.variable_dtype),
        )

    def get_config(self):
        config = super().get_config()
        config.update({"num_heads": self.num_heads, "head_dim": self.head_dim})
        return config


@register
class TransformerXLBackbone(Backbone):
    """The Transformer-XL decoder: adaptive input embeddings, post- or
    pre-norm relative-attention blocks with segment memory.

    Args:
        vocabulary_size: int. The number of token ids.
        num_layers: int. The number of blocks.
        num_heads: int. The attention heads per block.
        hidden_dim: int. The width of the hidden states (`d_model`).
        head_dim: int. The per-head size (`d_head`).
        intermediate_dim: int. The feed-forward width (`d_inner`).
        mem_len: int. The positions kept as memory per block (at least 1).
        embedding_dim: int or None. The adaptive input width of the first
            cluster (`d_embed`); `None`: `hidden_dim`.
        cutoffs: tuple of int. The adaptive input cluster boundaries (`()`
            for one table).
        div_val: int. Each later cluster's width is divided by this.
        clamp_len: int. Distances beyond it share one encoding (0: no
            clamp).
        same_length: bool. Every query attends to the same number of keys,
            `mem_len` (the window slides), instead of all earlier ones.
        per_layer_biases: bool. Each block has its own u, v (`untie_r`), or
            all share one pair.
        norm_first: bool. Pre-norm blocks (`pre_lnorm`).
        dropout: float. Dropout on embeddings, residual branches and the
            output.
        attention_dropout: float. Dropout on attention probabilities
            (`dropatt`).
        layer_norm_epsilon: float. The epsilon of every layer norm.
        initializer_range: float. The standard deviation of the normal
            initializers of embeddings and kernels (`init_std`).
        projection_initializer_range: float. That of the adaptive
            projections (`proj_init_std`).
        dtype: str, `keras.DTypePolicy` or None. The dtype policy of every
            layer.

    Inputs: a dict of `token_ids` `(batch, length)` int and `memory`
    `(batch, num_layers, memory_length, hidden_dim)`, `memory_length` from
    0 (no memory, the authors' start) up; `initial_memory` makes one.
    Outputs: a dict of `sequence_output` `(batch, length, hidden_dim)` and
    `memory`, the next segment's memory, `(batch, num_layers,
    min(memory_length + length, mem_len), hidden_dim)`, without gradient.

    Example:

    >>> import numpy as np
    >>> backbone = TransformerXLBackbone(vocabulary_size=50, num_layers=2, num_heads=2, hidden_dim=8,
    ...                                  head_dim=4, intermediate_dim=16, mem_len=4, cutoffs=[10, 20], div_val=2)
    >>> ids = np.array([[1, 2, 3], [4, 5, 6]])
    >>> out = backbone({"token_ids": ids, "memory": backbone.initial_memory(2)})
    >>> out = backbone({"token_ids": ids, "memory": out["memory"]})     # the next segment
    >>> tuple(out["sequence_output"].shape), tuple(out["memory"].shape)
    ((2, 3, 8), (2, 2, 4, 8))
    """

    family = "transformer_xl"
    # Megatron layouts of its own weights (see `models.layout_maps`).
    family_layout_rules = (
        (r"transformer_layer_\d+/position_projection/kernel", (None, "model")),  # W_R, column-parallel like W_k
        (r".*/(content_bias|position_bias)", ("model", None)),  # u, v (heads, head_dim): by head
        (r"token_embedding/embeddings_\d+", (None, "model")),  # adaptive input tables, on their width
        (r"token_embedding/projection_\d+", ("model", None)),  # (width, hidden_dim): row-parallel
        (r"lm_head/(output_embeddings_\d+|cluster_weight)", (None, "model")),  # adaptive softmax tables
        (r"lm_head/projection_\d+", (None, "model")),  # (hidden_dim, width): column-parallel
    )

    def __init__(
        self,
        vocabulary_size,
        num_layers,
        num_heads,
        hidden_dim,
        head_dim,
        intermediate_dim,
        mem_len,
        embedding_dim=None,
        cutoffs=(),
        div_val=1,
        clamp_len=0,
        same_length=False,
        per_layer_biases=True,
        norm_first=False,
        dropout=0.1,
        attention_dropout=0.0,
        layer_norm_epsilon=1e-5,
        initializer_range=0.02,
        projection_initializer_range=0.01,
        dtype=None,
        **kwargs,
    ):
        if not isinstance(mem_len, int) or mem_len < 1:
            raise ValueError(
                f"mem_len must be a positive int (the positions each block keeps as memory); got {mem_len!r}. "
                "A Transformer-XL without memory is a vanilla Transformer with relative positions."
            )
        if clamp_len < 0:
            raise ValueError(f"clamp_len must be non-negative (0: no clamp); got {clamp_len}.")
        embedding_dim = embedding_dim or hidden_dim

        # === Layers ===
        initializer = keras.initializers.RandomNormal(stddev=initializer_range)
        token_embedding = AdaptiveEmbedding(
            vocabulary_size,
            embedding_dim,
            hidden_dim,
            cutoffs=list(cutoffs),
            div_val=div_val,
            embeddings_initializer=clone_initializer(initializer),
            projection_initializer=keras.initializers.RandomNormal(stddev=projection_initializer_range),
            dtype=dtype,
            name="token_embedding",
        )
        relative_positions = RelativePositions(
            hidden_dim, clamp_len, mem_len if same_length else None, dtype=dtype, name="relative_positions"
        )
        embeddings_dropout = keras.layers.Dropout(dropout, dtype=dtype, name="embeddings_dropout")
        positions_dropout = keras.layers.Dropout(dropout, dtype=dtype, name="positions_dropout")
        output_dropout = keras.layers.Dropout(dropout, dtype=dtype, name="output_dropout")
        blocks = block_stack(
            TransformerXLBlock, num_layers, initializer, num_heads=num_heads, intermediate_dim=intermediate_dim,
            head_dim=head_dim, per_layer_biases=per_layer_biases, dropout=dropout, attention_dropout=attention_dropout,
            layer_norm_epsilon=layer_norm_epsilon, norm_first=norm_first, dtype=dtype,
        )
        shared_biases = None
        if not per_layer_biases:
            shared_biases = SharedRelativeBiases(num_heads, head_dim, dtype=dtype, name="shared_biases")

        # === Functional Model ===
        token_ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
        memory = keras.Input(shape=(num_layers, None, hidden_dim), name="memory")

        x = embeddings_dropout(token_embedding(token_ids))
        encodings, attention_mask = relative_positions(x, memory)
        encodings = positions_dropout(encodings)
        biases = None if shared_biases is None else shared_biases(x)
        memories = []
        for index, block in enumerate(blocks):
            layer_memory = memory[:, index]
            memories.append(ops.concatenate([ops.cast(layer_memory, x.dtype), x], axis=1)[:, -mem_len:])
            x = block(
                x, position_encodings=encodings, memory=layer_memory, attention_mask=attention_mask,
                shared_biases=biases,
            )
        x = output_dropout(x)
        new_memory = ops.stop_gradient(ops.stack(memories, axis=1))

        super().__init__(
            inputs={"token_ids": token_ids, "memory": memory},
            outputs={"sequence_output": x, "memory": new_memory},
            dtype=dtype,
            **kwargs,
        )
        self.token_embedding = token_embedding
        self.relative_positions = relative_positions
        self.embeddings_dropout = embeddings_dropout
        self.positions_dropout = positions_dropout
        self.output_dropout = output_dropout
        self.transformer_layers = blocks
        self.shared_biases = shared_biases

        # === Config ===
        self.vocabulary_size = vocabulary_size
        self.num_layers = num_layers
        self.num_heads = num_heads
        self.hidden_dim = hidden_dim
        self.head_dim = head_dim
        self.intermediate_dim = intermediate_dim
        self.mem_len = mem_len
        self.embedding_dim = embedding_dim
        self.cutoffs = list(cutoffs)
        self.div_val = div_val
        self.clamp_len = clamp_len
        self.same_length = same_length
        self.per_layer_biases = per_layer_biases
        self.norm_first = norm_first
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.layer_norm_epsilon = layer_norm_epsilon
        self.initializer_range = initializer_range
        self.projection_initializer_range = projection_initializer_range

    @property
    def attention_span(self):
        """How many keys a query sees at most: `mem_len` with `same_length`,
        otherwise `None` (all earlier positions of the segment and memory)."""
        return self.mem_len if self.same_length else None

    def initial_memory(self, batch_size, length=None):
        """A memory to start from, a numpy `(batch_size, num_layers, length,
        hidden_dim)` array of zeros: `length=None` gives `mem_len` zero vectors, as
        `transformers` starts; `length=0` an empty memory, as the authors'
        code starts."""
        length = self.mem_len if length is None else length
        return np.zeros((batch_size, self.num_layers, length, self.hidden_dim), dtype=self.compute_dtype)

    def validate_inputs(self, inputs):
        token_ids = inputs["token_ids"]
        check_id_range("token_ids", token_ids, self.vocabulary_size)
        memory_shape = tuple(np.shape(inputs["memory"]))
        expected = f"(batch, num_layers={self.num_layers}, memory_length, hidden_dim={self.hidden_dim})"
        if len(memory_shape) != 4 or memory_shape[1] != self.num_layers or memory_shape[3] != self.hidden_dim:
            raise ValueError(f"'memory' must be {expected}; got shape {memory_shape}.")
        batch = np.shape(token_ids)[0]
        if memory_shape[0] != batch:
            raise ValueError(
                f"'memory' is for a batch of {memory_shape[0]} sequences, 'token_ids' has {batch}: a memory "
                "belongs to the batch whose previous segment produced it."
            )

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "vocabulary_size": self.vocabulary_size,
                "num_layers": self.num_layers,
                "num_heads": self.num_heads,
                "hidden_dim": self.hidden_dim,
                "head_dim": self.head_dim,
                "intermediate_dim": self.intermediate_dim,
                "mem_len": self.mem_len,
                "embedding_dim": self.embedding_dim,
                "cutoffs": self.cutoffs,
                "div_val": self.div_val,
                "clamp_len": self.clamp_len,
                "same_length": self.same_length,
                "per_layer_biases": self.per_layer_biases,
                "norm_first": self.norm_first,
                "dropout": self.dropout,
                "attention_dropout": self.attention_dropout,
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "initializer_range": self.initializer_range,
                "projection_initializer_range": self.projection_initializer_range,
            }
        )
        return config
