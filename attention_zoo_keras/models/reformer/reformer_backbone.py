"""The Reformer (Kitaev, Kaiser and Levskaya, 2020, "Reformer: The Efficient
Transformer", ICLR 2020): a Transformer for long sequences, with LSH and
local attention, reversible residual layers, chunked feed-forward layers and
axial position embeddings.

    h⁰ = Dropout(TokenEmb(x)) + PositionEmb(t)                 (axial or learned)
    (Y1, Y2) = Reversible([F_1, G_1], …, [F_L, G_L])(h⁰, h⁰)
    out = Dropout(LayerNorm([Y1 ; Y2]))                        (width 2·d)

with `F_l` the attention branch (`ReformerAttention`: LSH or local
attention, per `attention_layers`) and `G_l` the feed-forward branch
(`ReformerFeedForward`); see `layers.ReversibleSequence`. As in Hugging Face
`transformers` (`ReformerModel`), whose checkpoints convert unchanged
(`reformer_convert`).

**Lengths.** LSH and local attention cut the sequence into chunks, so a
sequence longer than the shortest chunk length must be a multiple of every
chunk length (their least common multiple). While training that is an
error; at inference the inputs are padded to it (padding tokens masked out,
and in LSH put in a bucket of their own) and the outputs cut back —
transformers' rule (`_pad_to_mult_of_chunk_length`).
"""

import math

import keras
import numpy as np
from keras import ops

from attention_zoo_keras.attention.registry import get_mechanism
from attention_zoo_keras.layers.axial_position_embedding import AxialPositionEmbedding
from attention_zoo_keras.layers.fused_keras_layers import LayerNormalization
from attention_zoo_keras.layers.initializers import clone_initializer
from attention_zoo_keras.layers.position_embedding import PositionEmbedding
from attention_zoo_keras.layers.reversible import ReversibleSequence
from attention_zoo_keras.models.backbone import Backbone
from attention_zoo_keras.models.input_validation import check_token_inputs
from attention_zoo_keras.models.reformer.reformer_blocks import ReformerAttention
from attention_zoo_keras.models.reformer.reformer_blocks import ReformerFeedForward
from attention_zoo_keras.registration import register

CHUNKED_ATTENTION = ("lsh", "local")


def padded_length(length, chunk_lengths):
    """The length transformers pads a sequence of `length` tokens to at
    inference: unchanged up to the shortest chunk length (every layer then
    attends over the whole sequence) and for multiples of all of them,
    otherwise the next multiple of their least common multiple. `length` is
    an int, or an int32 scalar tensor (a length unknown while tracing) for
    which it returns one.

    >>> padded_length(5, [4, 8]), padded_length(4, [4, 8]), padded_length(16, [4, 8])
    (8, 4, 16)
    """
    if not chunk_lengths:
        return length
    multiple = math.lcm(*chunk_lengths)
    rounded_up = -(-length // multiple) * multiple
    if isinstance(length, (int, np.integer)):
        return length if length <= min(chunk_lengths) else rounded_up
    return ops.where(length <= min(chunk_lengths), length, rounded_up)


@register
class ChunkPadding(keras.layers.Layer):
    """Pads `token_ids` and `padding_mask` `(batch, length)` on the right to
    `padded_length(length, chunk_lengths)` (ids `pad_token_id`, mask 0) at
    inference, also where the length is unknown while tracing (a
    TensorFlow graph of any width, e.g. an exported serving signature);
    while training a length that would need padding is an error, and the
    length must be static.
    """

    def __init__(self, chunk_lengths, pad_token_id=0, **kwargs):
        super().__init__(**kwargs)
        self.chunk_lengths = [int(c) for c in chunk_lengths]
        self.pad_token_id = pad_token_id

    def call(self, token_ids, padding_mask, training=None):
        length = token_ids.shape[1]
        if length is None and training:
            raise ValueError(
                "While training, the Reformer needs a static sequence length (a multiple of the chunk lengths); "
                f"got token_ids of shape {tuple(token_ids.shape)}. Batches padded to varying widths (a "
                'preprocessor with padding="buckets") reach a TensorFlow graph with an unknown width: use '
                'padding="max_length".'
            )
        if length is None:  # unknown while tracing: padded by an amount computed in the graph
            length = ops.shape(token_ids)[1]
        padding = padded_length(length, self.chunk_lengths) - length
        if isinstance(padding, int) and padding == 0:
            return token_ids, padding_mask
        if training:
            multiple = math.lcm(*self.chunk_lengths)
            raise ValueError(
                f"While training, the sequence length {length} must be a multiple of the chunk lengths' least "
                f"common multiple {multiple} (chunk lengths {self.chunk_lengths}); pad the inputs to "
                f"{length + padding}."
            )
        token_ids = ops.pad(token_ids, [[0, 0], [0, padding]], constant_values=self.pad_token_id)
        padding_mask = ops.pad(padding_mask, [[0, 0], [0, padding]])
        return token_ids, padding_mask

    def compute_output_spec(self, token_ids, padding_mask):
        return (
            keras.KerasTensor((token_ids.shape[0], None), dtype=token_ids.dtype),
            keras.KerasTensor((padding_mask.shape[0], None), dtype=padding_mask.dtype),
        )

    def get_config(self):
        config = super().get_config()
        config.update({"chunk_lengths": self.chunk_lengths, "pad_token_id": self.pad_token_id})
        return config


@register
class CutToLength(keras.layers.Layer):
    """`x[:, :length]` with `length` that of `reference` (undoes `ChunkPadding`)."""

    def call(self, x, reference):
        return x[:, : ops.shape(reference)[1]]

    def compute_output_spec(self, x, reference):
        return keras.KerasTensor((x.shape[0], reference.shape[1]) + tuple(x.shape[2:]), dtype=x.dtype)


@register
class ReformerBackbone(Backbone):
    """The Reformer: token embeddings, axial (or learned) positions, a
    reversible stack of LSH / local attention and chunked feed-forward
    layers, and a layer norm over the two concatenated streams.

    Args:
        vocabulary_size: number of token ids.
        hidden_dim: width `d` of each stream (the output is `2·d` wide).
        num_heads: attention heads per layer.
        head_dim: size of each head (`attention_head_size`).
        intermediate_dim: feed-forward width (`feed_forward_size`).
        attention_layers: the mechanism of each layer, in order: `"lsh"`,
            `"local"`, or any other registered mechanism (e.g. `"softmax"`,
            full attention, for comparison); `attn_layers`.
        is_causal: a causal (language-model) stack (`is_decoder`).
        num_hashes: LSH hashing rounds.
        num_buckets: LSH buckets, an even int or a list for factorised
            buckets; `None` picks one from the sequence length.
        lsh_chunk_length: LSH chunk length (`lsh_attn_chunk_length`).
        lsh_num_chunks_before: earlier neighbouring chunks each LSH chunk
            attends to.
        lsh_num_chunks_after: later neighbouring chunks each LSH chunk
            attends to.
        hash_seed: an int makes the LSH rotations the same at every call;
            `None` draws new ones at every call (and every training step).
            To hash with given rotations (another implementation's), see
            `set_lsh_rotations`.
        local_chunk_length: local attention block length.
        local_num_chunks_before: earlier neighbouring blocks each local
            block attends to.
        local_num_chunks_after: later neighbouring blocks each local block
            attends to.
        axial_pos_shape: `(n₁, n₂)` of axial position embeddings (`n₁·n₂`
            positions), or `None` for a learned table of
            `max_sequence_length` positions.
        axial_pos_embds_dim: `(d₁, d₂)`, `d₁ + d₂ = hidden_dim`.
        max_sequence_length: the longest sequence; for axial positions at
            most (and by default) `n₁·n₂`.
        activation: feed-forward activation (`hidden_act`).
        dropout: dropout on embeddings, branch outputs and the output.
        lsh_attention_dropout: dropout on the LSH layers' attention
            probabilities.
        local_attention_dropout: dropout on the local layers' attention
            probabilities.
        layer_norm_epsilon: epsilon of every layer norm.
        feed_forward_chunk_size: positions per feed-forward chunk (`None`:
            all at once).
        initializer_range: standard deviation of the normal initializers.
        axial_norm_std: that of the axial position tables.
        pad_token_id: id of the padding added at inference.
        recompute: the reversible stack recomputes activations in the
            backward pass of training calls (JAX, TensorFlow, PyTorch)
            instead of storing them.
        seed: seed of the dropout randomness of the reversible stack.
        dtype: dtype policy of every layer.

    Inputs: a dict of `token_ids` and `padding_mask`, each `(batch, length)`
    int. Output: a dict with `sequence_output` `(batch, length, 2·hidden_dim)`.

    Example:

    >>> import numpy as np
    >>> backbone = ReformerBackbone(vocabulary_size=32, hidden_dim=8, num_heads=2, head_dim=4, intermediate_dim=16,
    ...                             attention_layers=["local", "lsh"], num_buckets=4, lsh_chunk_length=4,
    ...                             local_chunk_length=4, axial_pos_shape=(4, 4), axial_pos_embds_dim=(4, 4))
    >>> ids = np.array([[5, 6, 7, 8, 9, 10]])
    >>> out = backbone({"token_ids": ids, "padding_mask": np.ones_like(ids)})
    >>> tuple(out["sequence_output"].shape)
    (1, 6, 16)
    """

    family = "reformer"
    # Megatron layouts of its own weights (see `models.layout_maps`); LSH
    # attention's shared query-key projection is its `query`.
    family_layout_rules = ((r"position_embedding/embeddings_[01]", (None, None, "model")),)  # axial, on their width
    static_sequence_length = True  # chunked attention is shaped by the length

    def __init__(
        self,
        vocabulary_size,
        hidden_dim,
        num_heads,
        head_dim,
        intermediate_dim,
        attention_layers=("local", "lsh", "local", "lsh", "local", "lsh"),
        is_causal=True,
        num_hashes=1,
        num_buckets=None,
        lsh_chunk_length=64,
        lsh_num_chunks_before=1,
        lsh_num_chunks_after=0,
        hash_seed=None,
        local_chunk_length=64,
        local_num_chunks_before=1,
        local_num_chunks_after=0,
        axial_pos_shape=(64, 64),
        axial_pos_embds_dim=(64, 192),
        max_sequence_length=None,
        activation="relu",
        dropout=0.05,
        lsh_attention_dropout=0.0,
        local_attention_dropout=0.05,
        layer_norm_epsilon=1e-12,
        feed_forward_chunk_size=None,
        initializer_range=0.02,
        axial_norm_std=1.0,
        pad_token_id=0,
        recompute=True,
        seed=None,
        dtype=None,
        **kwargs,
    ):
        attention_layers = [str(name) for name in attention_layers]
        if not attention_layers:
            raise ValueError("attention_layers must name at least one layer's attention ('lsh' or 'local').")
        for name in set(attention_layers):
            get_mechanism(name)  # an unknown name raises, listing the mechanisms
        if axial_pos_shape is not None:
            axial_pos_shape = tuple(int(n) for n in axial_pos_shape)
            axial_positions = axial_pos_shape[0] * axial_pos_shape[1]
            if max_sequence_length is not None and max_sequence_length > axial_positions:
                raise ValueError(
                    f"With axial positions {axial_pos_shape} the model has {axial_positions} positions; got "
                    f"max_sequence_length={max_sequence_length}."
                )
            if sum(axial_pos_embds_dim) != hidden_dim:
                raise ValueError(
                    f"axial_pos_embds_dim {tuple(axial_pos_embds_dim)} must sum to hidden_dim {hidden_dim}."
                )
            max_sequence_length = max_sequence_length or axial_positions
        elif max_sequence_length is None:
            raise ValueError("Give max_sequence_length (the learned positions) or axial_pos_shape.")
        if is_causal and (
            ("lsh" in attention_layers and lsh_num_chunks_after) or ("local" in attention_layers and local_num_chunks_after)
        ):
            raise ValueError(
                "A causal Reformer attends to no later chunks: lsh_num_chunks_after and local_num_chunks_after "
                f"must be 0; got {lsh_num_chunks_after} and {local_num_chunks_after}."
            )
        options = {
            "lsh": {
                "num_hashes": num_hashes,
                "num_buckets": num_buckets,
                "chunk_length": lsh_chunk_length,
                "num_chunks_before": lsh_num_chunks_before,
                "num_chunks_after": lsh_num_chunks_after,
                "seed": hash_seed,
            },
            "local": {
                "block_size": local_chunk_length,
                "num_memory_blocks": local_num_chunks_before,
                "num_memory_blocks_after": local_num_chunks_after,
                "cyclic": not is_causal,
            },
        }
        attention_dropouts = {"lsh": lsh_attention_dropout, "local": local_attention_dropout}
        chunk_lengths = sorted(
            {{"lsh": lsh_chunk_length, "local": local_chunk_length}[name] for name in attention_layers if name in options}
        )

        initializer = keras.initializers.RandomNormal(stddev=initializer_range)
        chunk_padding = ChunkPadding(chunk_lengths, pad_token_id, dtype=dtype, name="chunk_padding")
        token_embedding = keras.layers.Embedding(
            vocabulary_size, hidden_dim, embeddings_initializer=clone_initializer(initializer),
            dtype=dtype, name="token_embedding",
        )
        if axial_pos_shape is not None:
            position_embedding = AxialPositionEmbedding(
                axial_pos_shape, axial_pos_embds_dim, dropout=dropout,
                initializer=keras.initializers.RandomNormal(stddev=axial_norm_std), dtype=dtype,
                name="position_embedding",
            )
            position_dropout = None
        else:
            position_embedding = PositionEmbedding(
                max_sequence_length, hidden_dim, initializer=clone_initializer(initializer), dtype=dtype,
                name="position_embedding",
            )
            position_dropout = keras.layers.Dropout(dropout, dtype=dtype, name="position_dropout")
        embeddings_dropout = keras.layers.Dropout(dropout, dtype=dtype, name="embeddings_dropout")
        blocks = [
            (
                ReformerAttention(
                    num_heads,
                    head_dim,
                    attention=name,
                    attention_options=options.get(name),
                    is_causal=is_causal,
                    dropout=dropout,
                    attention_dropout=attention_dropouts.get(name, 0.0),
                    layer_norm_epsilon=layer_norm_epsilon,
                    kernel_initializer=clone_initializer(initializer),
                    dtype=dtype,
                    name=f"attention_{index}",
                ),
                ReformerFeedForward(
                    intermediate_dim,
                    activation=activation,
                    dropout=dropout,
                    layer_norm_epsilon=layer_norm_epsilon,
                    chunk_size=feed_forward_chunk_size,
                    kernel_initializer=clone_initializer(initializer),
                    dtype=dtype,
                    name=f"feed_forward_{index}",
                ),
            )
            for index, name in enumerate(attention_layers)
        ]
        reversible = ReversibleSequence(blocks, recompute=recompute, seed=seed, dtype=dtype, name="reversible")
        final_norm = LayerNormalization(epsilon=layer_norm_epsilon, dtype=dtype, name="final_norm")
        output_dropout = keras.layers.Dropout(dropout, dtype=dtype, name="output_dropout")
        cut_to_length = CutToLength(dtype=dtype, name="cut_to_length")

        token_ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
        padding_mask = keras.Input(shape=(None,), dtype="int32", name="padding_mask")

        padded_ids, padded_mask = chunk_padding(token_ids, padding_mask)
        positions = position_embedding(padded_ids)
        if position_dropout is not None:
            positions = position_dropout(positions)
        x = embeddings_dropout(token_embedding(padded_ids)) + positions
        attention_mask = ops.expand_dims(ops.cast(padded_mask, "bool"), axis=1)
        y1, y2 = reversible(x, attention_mask=attention_mask)
        x = output_dropout(final_norm(ops.concatenate([y1, y2], axis=-1)))
        x = cut_to_length(x, token_ids)

        super().__init__(
            inputs={"token_ids": token_ids, "padding_mask": padding_mask},
            outputs={"sequence_output": x},
            dtype=dtype,
            **kwargs,
        )
        self.chunk_padding = chunk_padding
        self.token_embedding = token_embedding
        self.position_embedding = position_embedding
        self.position_dropout = position_dropout
        self.embeddings_dropout = embeddings_dropout
        self.reversible = reversible
        self.final_norm = final_norm
        self.output_dropout = output_dropout
        self.chunk_lengths = chunk_lengths
        self.vocabulary_size = vocabulary_size
        self.hidden_dim = hidden_dim
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.intermediate_dim = intermediate_dim
        self.attention_layers = attention_layers
        self.is_causal = is_causal
        self.num_hashes = num_hashes
        self.num_buckets = num_buckets
        self.lsh_chunk_length = lsh_chunk_length
        self.lsh_num_chunks_before = lsh_num_chunks_before
        self.lsh_num_chunks_after = lsh_num_chunks_after
        self.hash_seed = hash_seed
        self.local_chunk_length = local_chunk_length
        self.local_num_chunks_before = local_num_chunks_before
        self.local_num_chunks_after = local_num_chunks_after
        self.axial_pos_shape = axial_pos_shape
        self.axial_pos_embds_dim = None if axial_pos_shape is None else tuple(axial_pos_embds_dim)
        self.max_sequence_length = max_sequence_length
        self.activation = activation
        self.dropout = dropout
        self.lsh_attention_dropout = lsh_attention_dropout
        self.local_attention_dropout = local_attention_dropout
        self.layer_norm_epsilon = layer_norm_epsilon
        self.feed_forward_chunk_size = feed_forward_chunk_size
        self.initializer_range = initializer_range
        self.axial_norm_std = axial_norm_std
        self.pad_token_id = pad_token_id
        self.recompute = recompute
        self.seed = seed

    @property
    def attention_branches(self):
        """The attention branch `F` (`ReformerAttention`) of every layer."""
        return self.reversible.f_layers

    @property
    def feed_forward_branches(self):
        """The feed-forward branch `G` (`ReformerFeedForward`) of every layer."""
        return self.reversible.g_layers

    def _lsh_branches(self, what):
        branches = [branch for branch in self.attention_branches if branch.attention == "lsh"]
        if not branches:
            raise ValueError(
                f"{what}: this Reformer has no LSH attention layer (attention_layers={self.attention_layers})."
            )
        return branches

    @property
    def lsh_rotations_shape(self):
        """The shape of the rotations every LSH layer hashes with,
        `(num_heads, head_dim, num_hashes, Σ b_f / 2)`; see
        `set_lsh_rotations`. Raises `ValueError` without LSH layers or
        without `num_buckets`."""
        return self._lsh_branches("lsh_rotations_shape")[0].rotations_shape

    def set_lsh_rotations(self, rotations):
        """Makes every LSH layer hash with `rotations` (or, with `None`, draw
        them again from `hash_seed`), see `ReformerAttention.set_rotations`.

        transformers' Reformer with `hash_seed=s` reseeds torch in every LSH
        layer, so all its layers hash with one draw; to reproduce it:

            torch.manual_seed(s)
            backbone.set_lsh_rotations(torch.randn(backbone.lsh_rotations_shape).numpy())

        Raises:
            ValueError: without LSH layers, or for rotations of another shape.
        """
        for branch in self._lsh_branches("set_lsh_rotations"):
            branch.set_rotations(rotations)

    def validate_inputs(self, inputs):
        check_token_inputs(inputs, self.vocabulary_size)
        length = np.shape(inputs["token_ids"])[-1]
        padded = padded_length(length, self.chunk_lengths)
        if padded > self.max_sequence_length:
            detail = "" if padded == length else f" (padded to {padded}, a multiple of the chunk lengths)"
            raise ValueError(
                f"'token_ids' has length {length}{detail}, longer than the model's {self.max_sequence_length} "
                "positions. Truncate it (the preprocessor does so for raw text)."
            )

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "vocabulary_size": self.vocabulary_size,
                "hidden_dim": self.hidden_dim,
                "num_heads": self.num_heads,
                "head_dim": self.head_dim,
                "intermediate_dim": self.intermediate_dim,
                "attention_layers": self.attention_layers,
                "is_causal": self.is_causal,
                "num_hashes": self.num_hashes,
                "num_buckets": self.num_buckets,
                "lsh_chunk_length": self.lsh_chunk_length,
                "lsh_num_chunks_before": self.lsh_num_chunks_before,
                "lsh_num_chunks_after": self.lsh_num_chunks_after,
                "hash_seed": self.hash_seed,
                "local_chunk_length": self.local_chunk_length,
                "local_num_chunks_before": self.local_num_chunks_before,
                "local_num_chunks_after": self.local_num_chunks_after,
                "axial_pos_shape": self.axial_pos_shape,
                "axial_pos_embds_dim": self.axial_pos_embds_dim,
                "max_sequence_length": self.max_sequence_length,
                "activation": self.activation,
                "dropout": self.dropout,
                "lsh_attention_dropout": self.lsh_attention_dropout,
                "local_attention_dropout": self.local_attention_dropout,
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "feed_forward_chunk_size": self.feed_forward_chunk_size,
                "initializer_range": self.initializer_range,
                "axial_norm_std": self.axial_norm_std,
                "pad_token_id": self.pad_token_id,
                "recompute": self.recompute,
                "seed": self.seed,
            }
        )
        return config
