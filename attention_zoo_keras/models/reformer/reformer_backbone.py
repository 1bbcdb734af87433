"""The Reformer (Kitaev, Kaiser and Levskaya, 2020, "Reformer: The Efficient
Transformer", ICLR 2020): a Transformer for long sequences, with LSH and
local attention, reversible residual layers, chunked feed-forward layers and
axial position embeddings.

    h⁰ = Dropout(TokenEmb(x)) + PositionEmb(t)                 (axial or learned)
    (Y1, Y2) = Reversible([F_1, G_1], …, [F_L, G_L])(h⁰, h⁰)
    out = Dropout(LayerNorm([Y1 ; Y2]))                        (width 2·d)

with `F_l` the attention branch (`ReformerAttention`: LSH or local
attention, per `attention`) and `G_l` the feed-forward branch
(`ReformerFeedForward`); see `layers.ReversibleSequence`. As in Hugging Face
`transformers` (`ReformerModel`), whose checkpoints convert unchanged
(`reformer_convert`). At inference the inputs are padded to a multiple of
the chunk lengths (`reformer_chunk_padding`).
"""

import keras
import numpy as np
from keras import ops

from attention_zoo_keras.layers.axial_position_embedding import AxialPositionEmbedding
from attention_zoo_keras.layers.embedding import Embedding
from attention_zoo_keras.layers.fused_keras_layers import LayerNormalization
from attention_zoo_keras.layers.initializers import clone_initializer
from attention_zoo_keras.layers.position_embedding import PositionEmbedding
from attention_zoo_keras.layers.reversible import ReversibleSequence
from attention_zoo_keras.models.backbone import Backbone
from attention_zoo_keras.models.input_validation import check_token_inputs
from attention_zoo_keras.models.reformer.reformer_attention_options import DEFAULT_ATTENTION
from attention_zoo_keras.models.reformer.reformer_attention_options import attention_dropout_with_defaults
from attention_zoo_keras.models.reformer.reformer_attention_options import attention_options_with_defaults
from attention_zoo_keras.models.reformer.reformer_attention_options import check_causal_windows
from attention_zoo_keras.models.reformer.reformer_attention_options import chunk_lengths
from attention_zoo_keras.models.reformer.reformer_attention_options import layer_attention
from attention_zoo_keras.models.reformer.reformer_attention_options import layer_attention_dropout
from attention_zoo_keras.models.reformer.reformer_attention_options import layer_options
from attention_zoo_keras.models.reformer.reformer_attention_options import translate_legacy_config
from attention_zoo_keras.models.reformer.reformer_blocks import ReformerAttention
from attention_zoo_keras.models.reformer.reformer_blocks import ReformerFeedForward
from attention_zoo_keras.models.reformer.reformer_chunk_padding import ChunkPadding
from attention_zoo_keras.models.reformer.reformer_chunk_padding import CutToLength
from attention_zoo_keras.models.reformer.reformer_chunk_padding import padded_length
from attention_zoo_keras.registration import register


@register
class ReformerBackbone(Backbone):
    """The Reformer: token embeddings, axial (or learned) positions, a
    reversible stack of LSH / local attention and chunked feed-forward
    layers, and a layer norm over the two concatenated streams.

    Args:
        vocabulary_size: int. The number of token ids.
        hidden_dim: int. The width `d` of each stream (the output is `2·d`
            wide).
        num_heads: int. The attention heads per layer.
        head_dim: int. The size of each head (`attention_head_size`).
        intermediate_dim: int. The feed-forward width (`feed_forward_size`).
        attention: str or sequence of str. The mechanism of each layer, in
            order (`attn_layers`): `"lsh"`, `"local"`, or any other
            registered mechanism (e.g. `"softmax"`, full attention, for
            comparison); a single name for every layer (with `num_layers`).
        attention_options: dict or None. Each mechanism's options,
            `{mechanism: {option: value}}`, named as the mechanism takes
            them (`docs/attention/lsh.md`, `docs/attention/local.md`), over
            the Reformer's defaults: for `"lsh"` `num_hashes=1`,
            `num_buckets=None` (picked from the sequence length; an even
            int, or a list for factorised buckets), `chunk_length=64`,
            `num_chunks_before=1`, `num_chunks_after=0`, `seed=None` (an
            int makes the LSH rotations the same at every call, `None`
            draws new ones at every call; to hash with given rotations see
            `set_lsh_rotations`); for `"local"` `block_size=64`,
            `num_memory_blocks=1`, `num_memory_blocks_after=0` (and
            `cyclic`, by default `not is_causal`).
        num_layers: int or None. The number of layers; needed where
            `attention` is a single name, else the length of `attention`.
        is_causal: bool. A causal (language-model) stack (`is_decoder`).
        axial_pos_shape: tuple of int or None. `(n₁, n₂)` of axial position
            embeddings (`n₁·n₂` positions), or `None` for a learned table
            of `max_sequence_length` positions.
        axial_pos_embds_dim: tuple of int. `(d₁, d₂)`, `d₁ + d₂ = hidden_dim`.
        max_sequence_length: int or None. The longest sequence; for axial
            positions at most (and by default) `n₁·n₂`.
        activation: str. The feed-forward activation (`hidden_act`).
        dropout: float. Dropout on embeddings, branch outputs and the output.
        attention_dropout: float, dict or None. Dropout on the attention
            probabilities: one rate for every layer, or `{mechanism: rate}`
            over the defaults `{"lsh": 0.0, "local": 0.05}` (0 for other
            mechanisms).
        layer_norm_epsilon: float. The epsilon of every layer norm.
        feed_forward_chunk_size: int or None. Positions per feed-forward
            chunk (`None`: all at once).
        initializer_range: float. The standard deviation of the normal
            initializers.
        axial_norm_std: float. That of the axial position tables.
        pad_token_id: int. The id of the padding added at inference.
        recompute: bool. The reversible stack recomputes activations in the
            backward pass of training calls (JAX, TensorFlow, PyTorch)
            instead of storing them.
        seed: int or None. The seed of the dropout randomness of the
            reversible stack.
        dtype: str, `keras.DTypePolicy` or None. The dtype policy of every
            layer.

    Inputs: a dict of `token_ids` and `padding_mask`, each `(batch, length)`
    int. Output: a dict with `sequence_output` `(batch, length, 2·hidden_dim)`.

    Configs saved with the earlier flat arguments (`attention_layers`,
    `lsh_chunk_length`, `local_chunk_length`, …) still load, from presets
    too (`upgraded_config`: `reformer_attention_options.translate_legacy_config`).

    Example:

    >>> import numpy as np
    >>> backbone = ReformerBackbone(vocabulary_size=32, hidden_dim=8, num_heads=2, head_dim=4, intermediate_dim=16,
    ...                             attention=["local", "lsh"],
    ...                             attention_options={"lsh": {"num_buckets": 4, "chunk_length": 4},
    ...                                                "local": {"block_size": 4}},
    ...                             axial_pos_shape=(4, 4), axial_pos_embds_dim=(4, 4))
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
        attention=DEFAULT_ATTENTION,
        attention_options=None,
        num_layers=None,
        is_causal=True,
        axial_pos_shape=(64, 64),
        axial_pos_embds_dim=(64, 192),
        max_sequence_length=None,
        activation="relu",
        dropout=0.05,
        attention_dropout=None,
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
        layers = layer_attention(attention, num_layers)
        attention_options = attention_options_with_defaults(attention_options)
        attention_dropout = attention_dropout_with_defaults(attention_dropout, layers)
        check_causal_windows(layers, attention_options, is_causal)
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
        chunks = chunk_lengths(layers, attention_options)
        initializer = keras.initializers.RandomNormal(stddev=initializer_range)

        # === Layers ===
        chunk_padding = ChunkPadding(chunks, pad_token_id, dtype=dtype, name="chunk_padding")
        token_embedding = Embedding(
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
                    attention_options=layer_options(name, attention_options, is_causal),
                    is_causal=is_causal,
                    dropout=dropout,
                    attention_dropout=layer_attention_dropout(attention_dropout, name),
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
            for index, name in enumerate(layers)
        ]
        reversible = ReversibleSequence(blocks, recompute=recompute, seed=seed, dtype=dtype, name="reversible")
        final_norm = LayerNormalization(epsilon=layer_norm_epsilon, dtype=dtype, name="final_norm")
        output_dropout = keras.layers.Dropout(dropout, dtype=dtype, name="output_dropout")
        cut_to_length = CutToLength(dtype=dtype, name="cut_to_length")

        # === Functional Model ===
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

        # === Config ===
        self.chunk_lengths = chunks
        self.vocabulary_size = vocabulary_size
        self.hidden_dim = hidden_dim
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.intermediate_dim = intermediate_dim
        self.attention = layers
        self.attention_options = attention_options
        self.num_layers = len(layers)
        self.is_causal = is_causal
        self.axial_pos_shape = axial_pos_shape
        self.axial_pos_embds_dim = None if axial_pos_shape is None else tuple(axial_pos_embds_dim)
        self.max_sequence_length = max_sequence_length
        self.activation = activation
        self.dropout = dropout
        self.attention_dropout = attention_dropout
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
                f"{what}: this Reformer has no LSH attention layer (attention={self.attention})."
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
        them again from the LSH `seed` option), see
        `ReformerAttention.set_rotations`.

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
                "attention": self.attention,
                "attention_options": self.attention_options,
                "num_layers": self.num_layers,
                "is_causal": self.is_causal,
                "axial_pos_shape": self.axial_pos_shape,
                "axial_pos_embds_dim": self.axial_pos_embds_dim,
                "max_sequence_length": self.max_sequence_length,
                "activation": self.activation,
                "dropout": self.dropout,
                "attention_dropout": self.attention_dropout,
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

    @classmethod
    def upgraded_config(cls, config):
        return translate_legacy_config(config)
