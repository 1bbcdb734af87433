"""The encoder-decoder Transformer (Vaswani et al., 2017, "Attention Is All
You Need"):

    X_0 = Dropout(s · Emb(x) + P_{0..m−1}),      Y_0 = Dropout(s · Emb'(y) + P_{0..n−1})
    X_l = EncoderBlock(X_{l−1}),                  l = 1..N
    Y_l = DecoderBlock(Y_{l−1}, X_N),             l = 1..N   (causal self-attention)

with `s = √d_model` (§3.4), `P` sinusoidal (§3.5) or learned position
embeddings, post-norm blocks as in the paper or pre-norm ones (with a final
layer norm on each stack, as `torch.nn.Transformer` and pre-norm models
have). Marian MT (Junczys-Dowmunt et al., 2018) is this architecture with
SiLU feed-forward activations and tensor2tensor's sinusoid layout.
"""

import math
import types

import keras
from keras import ops

from attention_zoo_keras import backend_support
from attention_zoo_keras.layers.block_stack import block_stack
from attention_zoo_keras.layers.embedding import Embedding
from attention_zoo_keras.layers.fused_keras_layers import LayerNormalization
from attention_zoo_keras.layers.initializers import clone_initializer
from attention_zoo_keras.layers.padding_last import PermutePositions
from attention_zoo_keras.layers.padding_last import padding_last_order
from attention_zoo_keras.layers.position_embedding import PositionEmbedding
from attention_zoo_keras.layers.sinusoidal_position_embedding import SinusoidalPositionEmbedding
from attention_zoo_keras.layers.transformer_decoder_block import TransformerDecoderBlock
from attention_zoo_keras.layers.transformer_encoder_block import TransformerEncoderBlock
from attention_zoo_keras.models.backbone import Backbone
from attention_zoo_keras.models.input_validation import check_token_inputs
from attention_zoo_keras.registration import register

POSITION_EMBEDDINGS = ("sinusoidal", "sinusoidal_concatenated", "learned")


def _embed(token_embedding, position_embedding, scale, token_ids, start_index=0):
    """`scale · Emb(ids) + P`, positions from `start_index`."""
    x = token_embedding(token_ids)
    if scale != 1.0:
        x = x * ops.cast(scale, x.dtype)
    return x + position_embedding(token_ids, start_index=start_index)


@register
class TransformerBackbone(Backbone):
    """Encoder and decoder stacks of the Transformer, without the output layer.

    Args:
        vocabulary_size: int. The number of source token ids (and target
            ids, when the vocabulary is shared).
        num_encoder_layers: int. The number of encoder blocks.
        num_decoder_layers: int. The number of decoder blocks.
        num_heads: int. The attention heads in every attention layer.
        hidden_dim: int. The width `d_model`.
        intermediate_dim: int. The feed-forward width (`d_ff`).
        target_vocabulary_size: int or None. The number of target ids when
            the target side has its own embedding; `None` shares one
            embedding between the
            encoder, the decoder (and a tied output layer), as the paper
            does for a shared source-target vocabulary (§3.4).
        dropout: float. Dropout on the embedding sums and on every residual
            branch (`P_drop`, 0.1 in the paper).
        attention_dropout: float. Dropout on attention probabilities.
        activation: str. The feed-forward activation: `"relu"` (paper),
            `"swish"` (Marian), `"gelu"`.
        max_sequence_length: int. The positions of the position embeddings
            (the longest source or target).
        position_embedding: str. `"sinusoidal"` (the paper's interleaved
            layout), `"sinusoidal_concatenated"` (sines then cosines: Marian,
            fairseq, tensor2tensor) or `"learned"`.
        scale_embeddings: bool. Multiply token embeddings by `√hidden_dim`.
        norm_first: bool. `False` for post-norm blocks (paper, Marian),
            `True` for pre-norm.
        final_norm: bool or None. A layer norm on the output of each stack;
            `None`: `norm_first` (pre-norm stacks need one;
            `torch.nn.Transformer` has one either way).
        layer_norm_epsilon: float. The epsilon of every layer norm.
        attention: str. The self-attention mechanism of every block (see
            `attention.mechanism_names()`); cross-attention is softmax.
        attention_options: dict or None. The mechanism's options.
        embeddings_initializer: str, `keras.initializers.Initializer` or
            None. The initializer of token embeddings and learned positions;
            `None`: `N(0, hidden_dim^-0.5)`, so that scaled embeddings have
            unit variance.
        kernel_initializer: str or `keras.initializers.Initializer`. The
            initializer of every dense kernel.
        dtype: str, `keras.DTypePolicy` or None. The dtype policy of every
            layer, e.g. `"bfloat16"`.

    Inputs: a dict of `encoder_token_ids`, `encoder_padding_mask`
    `(batch, source_length)` and `decoder_token_ids`, `decoder_padding_mask`
    `(batch, target_length)`, int. Outputs: a dict of
    `encoder_sequence_output` `(batch, source_length, hidden_dim)` and
    `decoder_sequence_output` `(batch, target_length, hidden_dim)`.

    Example:

    >>> import numpy as np
    >>> backbone = TransformerBackbone(vocabulary_size=50, num_encoder_layers=2, num_decoder_layers=2,
    ...                                num_heads=2, hidden_dim=16, intermediate_dim=32, max_sequence_length=16)
    >>> out = backbone({"encoder_token_ids": np.array([[5, 6, 7, 2]]), "encoder_padding_mask": np.array([[1, 1, 1, 1]]),
    ...                 "decoder_token_ids": np.array([[0, 8, 9]]), "decoder_padding_mask": np.array([[1, 1, 1]])})
    >>> tuple(out["encoder_sequence_output"].shape), tuple(out["decoder_sequence_output"].shape)
    ((1, 4, 16), (1, 3, 16))
    """

    family = "transformer"
    # Megatron layouts of its own weights (see `models.layout_maps`).
    family_layout_rules = ((r"target_token_embedding/embeddings", (None, "model")),)  # a separate target vocabulary

    def __init__(
        self,
        vocabulary_size,
        num_encoder_layers,
        num_decoder_layers,
        num_heads,
        hidden_dim,
        intermediate_dim,
        target_vocabulary_size=None,
        dropout=0.1,
        attention_dropout=0.0,
        activation="relu",
        max_sequence_length=512,
        position_embedding="sinusoidal",
        scale_embeddings=True,
        norm_first=False,
        final_norm=None,
        layer_norm_epsilon=1e-5,
        attention="softmax",
        attention_options=None,
        embeddings_initializer=None,
        kernel_initializer="glorot_uniform",
        dtype=None,
        **kwargs,
    ):
        if position_embedding not in POSITION_EMBEDDINGS:
            raise ValueError(
                f"position_embedding must be one of {POSITION_EMBEDDINGS}; got '{position_embedding}'."
            )
        if final_norm is None:
            final_norm = norm_first
        if embeddings_initializer is None:
            embeddings_initializer = keras.initializers.RandomNormal(stddev=hidden_dim**-0.5)
        embeddings_initializer = keras.initializers.get(embeddings_initializer)
        kernel_initializer = keras.initializers.get(kernel_initializer)

        # === Layers ===
        def embedding(size, name):
            return Embedding(
                size, hidden_dim, embeddings_initializer=clone_initializer(embeddings_initializer),
                dtype=dtype, name=name,
            )

        def positions(name):
            if position_embedding == "learned":
                return PositionEmbedding(
                    max_sequence_length, hidden_dim, initializer=clone_initializer(embeddings_initializer),
                    dtype=dtype, name=name,
                )
            layout = "concatenated" if position_embedding == "sinusoidal_concatenated" else "interleaved"
            return SinusoidalPositionEmbedding(max_sequence_length, hidden_dim, layout=layout, dtype=dtype, name=name)

        def norm(name):
            return LayerNormalization(epsilon=layer_norm_epsilon, dtype=dtype, name=name) if final_norm else None

        block_arguments = dict(
            num_heads=num_heads,
            intermediate_dim=intermediate_dim,
            activation=activation,
            dropout=dropout,
            attention_dropout=attention_dropout,
            layer_norm_epsilon=layer_norm_epsilon,
            norm_first=norm_first,
            attention=attention,
            attention_options=attention_options,
            dtype=dtype,
        )
        token_embedding = embedding(vocabulary_size, "token_embedding")
        target_token_embedding = (
            token_embedding if target_vocabulary_size is None
            else embedding(target_vocabulary_size, "target_token_embedding")
        )
        encoder_position_embedding = positions("encoder_position_embedding")
        decoder_position_embedding = positions("decoder_position_embedding")
        encoder_embeddings_dropout = keras.layers.Dropout(dropout, dtype=dtype, name="encoder_embeddings_dropout")
        decoder_embeddings_dropout = keras.layers.Dropout(dropout, dtype=dtype, name="decoder_embeddings_dropout")
        encoder_layers = block_stack(
            TransformerEncoderBlock, num_encoder_layers, kernel_initializer, name="encoder_layer", **block_arguments
        )
        decoder_layers = block_stack(
            TransformerDecoderBlock, num_decoder_layers, kernel_initializer, name="decoder_layer", **block_arguments
        )
        encoder_final_norm = norm("encoder_final_norm")
        decoder_final_norm = norm("decoder_final_norm")
        encoder_padding_last = encoder_input_order = None
        if attention == "softmax" and backend_support.encoders_move_padding_last():
            encoder_padding_last = PermutePositions(dtype=dtype, name="encoder_padding_last")
            encoder_input_order = PermutePositions(dtype=dtype, name="encoder_input_order")

        # === Functional Model ===
        encoder_token_ids = keras.Input(shape=(None,), dtype="int32", name="encoder_token_ids")
        encoder_padding_mask = keras.Input(shape=(None,), dtype="int32", name="encoder_padding_mask")
        decoder_token_ids = keras.Input(shape=(None,), dtype="int32", name="decoder_token_ids")
        decoder_padding_mask = keras.Input(shape=(None,), dtype="int32", name="decoder_padding_mask")

        # The graph is built by the same `encode` and `decode` that decoding
        # calls later, on the layers gathered in a namespace: the model cannot
        # hold them before `super().__init__` (torch modules refuse it).
        parts = types.SimpleNamespace(
            token_embedding=token_embedding,
            target_token_embedding=target_token_embedding,
            encoder_position_embedding=encoder_position_embedding,
            decoder_position_embedding=decoder_position_embedding,
            encoder_embeddings_dropout=encoder_embeddings_dropout,
            decoder_embeddings_dropout=decoder_embeddings_dropout,
            encoder_layers=encoder_layers,
            decoder_layers=decoder_layers,
            encoder_final_norm=encoder_final_norm,
            decoder_final_norm=decoder_final_norm,
            encoder_padding_last=encoder_padding_last,
            encoder_input_order=encoder_input_order,
            embedding_scale=math.sqrt(hidden_dim) if scale_embeddings else 1.0,
        )
        encoder_output = TransformerBackbone.encode(parts, encoder_token_ids, encoder_padding_mask)
        decoder_output = TransformerBackbone.decode(
            parts, decoder_token_ids, decoder_padding_mask, encoder_output, encoder_padding_mask
        )

        super().__init__(
            inputs={
                "encoder_token_ids": encoder_token_ids,
                "encoder_padding_mask": encoder_padding_mask,
                "decoder_token_ids": decoder_token_ids,
                "decoder_padding_mask": decoder_padding_mask,
            },
            outputs={"encoder_sequence_output": encoder_output, "decoder_sequence_output": decoder_output},
            dtype=dtype,
            **kwargs,
        )
        for name, layer in vars(parts).items():
            setattr(self, name, layer)

        # === Config ===
        self.vocabulary_size = vocabulary_size
        self.num_encoder_layers = num_encoder_layers
        self.num_decoder_layers = num_decoder_layers
        self.num_heads = num_heads
        self.hidden_dim = hidden_dim
        self.intermediate_dim = intermediate_dim
        self.target_vocabulary_size = target_vocabulary_size
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.activation = activation
        self.max_sequence_length = max_sequence_length
        self.position_embedding = position_embedding
        self.scale_embeddings = scale_embeddings
        self.norm_first = norm_first
        self.final_norm = final_norm
        self.layer_norm_epsilon = layer_norm_epsilon
        self.attention = attention
        self.attention_options = dict(attention_options or {})
        self.embeddings_initializer = embeddings_initializer
        self.kernel_initializer = kernel_initializer

    @property
    def decoder_vocabulary_size(self):
        """Number of target token ids (the output layer's width)."""
        return self.target_vocabulary_size or self.vocabulary_size

    def encode(self, token_ids, padding_mask, training=None):
        """The encoder stack: `(batch, source_length, hidden_dim)`. Under JAX
        its blocks see each row's padding after its tokens and attend by key
        lengths (`layers.padding_last`); the output is in the inputs' order."""
        x = _embed(self.token_embedding, self.encoder_position_embedding, self.embedding_scale, token_ids)
        x = self.encoder_embeddings_dropout(x, training=training)
        if self.encoder_padding_last is not None:
            order, destination, key_lengths = padding_last_order(padding_mask)
            x = self.encoder_padding_last(x, order, destination)
            padding = {"key_lengths": key_lengths}
        else:
            padding = {"attention_mask": ops.expand_dims(ops.cast(padding_mask, "bool"), axis=1)}
        for block in self.encoder_layers:
            x = block(x, training=training, **padding)
        if self.encoder_padding_last is not None:
            x = self.encoder_input_order(x, destination, order)
        return x if self.encoder_final_norm is None else self.encoder_final_norm(x)

    def decode(
        self,
        token_ids,
        padding_mask,
        encoder_output,
        encoder_padding_mask,
        training=None,
        cache=None,
        cache_update_index=0,
        encoder_key_values=None,
        encoder_key_lengths=None,
    ):
        """The decoder stack over target tokens at positions
        `cache_update_index, …`.

        Args:
            token_ids: int tensor of shape `(batch, new_length)`. The target
                ids.
            padding_mask: tensor or None. `(batch, new_length)`, or with a
                cache `(batch, positions)` over absolute positions; `None`
                for no padding.
            encoder_output: tensor of shape `(batch, source_length,
                hidden_dim)` or None. The encoder's output, or `None` when
                `encoder_key_values` is given.
            encoder_padding_mask: tensor of shape `(batch, source_length)`
                or None. True on real source tokens; `None` with
                `encoder_key_lengths`.
            training: bool or None. Dropout on or off.
            cache: tuple or None. Per-layer self-attention caches (see
                `TransformerDecoderBlock`).
            cache_update_index: int or int scalar tensor. The position of the
                first new token.
            encoder_key_values: tuple or None. Per-layer cross-attention keys
                and values
                (`decoder_layers[i].cross_attention.project_key_value`).
            encoder_key_lengths: int tensor of shape `(batch,)` or None.
                Instead of `encoder_padding_mask`, for right-padded sources:
                each source's number of tokens (the cross-attention is then
                given key lengths, not a mask).

        Returns:
            `(batch, new_length, hidden_dim)`; with a cache, the tuple
            `(output, new_cache)`.
        """
        x = _embed(
            self.target_token_embedding, self.decoder_position_embedding, self.embedding_scale, token_ids,
            cache_update_index,
        )
        x = self.decoder_embeddings_dropout(x, training=training)
        attention_mask = None
        if padding_mask is not None:
            attention_mask = ops.expand_dims(ops.cast(padding_mask, "bool"), axis=1)
        encoder_attention_mask = None
        if encoder_key_lengths is None:
            encoder_attention_mask = ops.expand_dims(ops.cast(encoder_padding_mask, "bool"), axis=1)
        new_cache = []
        for index, block in enumerate(self.decoder_layers):
            arguments = dict(
                attention_mask=attention_mask, encoder_attention_mask=encoder_attention_mask,
                encoder_key_lengths=encoder_key_lengths, training=training,
            )
            if encoder_key_values is not None:
                arguments["encoder_key_value"] = encoder_key_values[index]
            if cache is None:
                x = block(x, encoder_output, **arguments)
            else:
                x, layer_cache = block(
                    x, encoder_output, cache=cache[index], cache_update_index=cache_update_index, **arguments
                )
                new_cache.append(layer_cache)
        if self.decoder_final_norm is not None:
            x = self.decoder_final_norm(x)
        return x if cache is None else (x, tuple(new_cache))

    def validate_inputs(self, inputs):
        for side, vocabulary in (("encoder", self.vocabulary_size), ("decoder", self.decoder_vocabulary_size)):
            check_token_inputs(inputs, vocabulary, self.max_sequence_length, prefix=f"{side}_")
        source_batch = ops.shape(inputs["encoder_token_ids"])[0]
        target_batch = ops.shape(inputs["decoder_token_ids"])[0]
        if source_batch != target_batch:
            raise ValueError(
                f"encoder_token_ids has {source_batch} rows but decoder_token_ids has {target_batch}; "
                "every source needs its target."
            )

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "vocabulary_size": self.vocabulary_size,
                "num_encoder_layers": self.num_encoder_layers,
                "num_decoder_layers": self.num_decoder_layers,
                "num_heads": self.num_heads,
                "hidden_dim": self.hidden_dim,
                "intermediate_dim": self.intermediate_dim,
                "target_vocabulary_size": self.target_vocabulary_size,
                "dropout": self.dropout,
                "attention_dropout": self.attention_dropout,
                "activation": self.activation,
                "max_sequence_length": self.max_sequence_length,
                "position_embedding": self.position_embedding,
                "scale_embeddings": self.scale_embeddings,
                "norm_first": self.norm_first,
                "final_norm": self.final_norm,
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "attention": self.attention,
                "attention_options": self.attention_options,
                "embeddings_initializer": keras.initializers.serialize(self.embeddings_initializer),
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            }
        )
        return config
