"""ViLBERT (Lu et al., 2019, "ViLBERT: Pretraining Task-Agnostic
Visiolinguistic Representations for Vision-and-Language Tasks").

Two BERT-style streams, text and image regions, joined by co-attentional
layers (`CoAttentionBlock`):

    T_0 = LayerNorm(TokenEmb(x) + PositionEmb(t) + SegmentEmb(s))
          (with task tokens, TaskEmb(task) is inserted after [CLS], always attended)
    V_0 = LayerNorm(F W_f + b_f + B W_b + b_b)       F: region features, B: boxes
    for i = 1..K:
        T ← text layers   (co_attention_text_layers[i-1] − 1 .. end)
        V ← visual layers (co_attention_visual_layers[i-1] − 1 .. end)
        T, V ← CoAttention_i(T, V)
    T ← the remaining text layers;  V ← the remaining visual layers
    pooled        = ReLU(W_t T[0] + b_t)             (co_attention_dim)
    visual_pooled = ReLU(W_v V[0] + b_v)             (co_attention_dim)

Both streams' single-stream layers are post-norm BERT layers, the visual
ones of their own width, heads and feed-forward size. A box is five numbers,
`(x1, y1, x2, y2, area)`, normalised by the image size; by the authors'
convention region 0 is the whole image, `(0, 0, 1, 1, 1)`, with the mean of
the region features, and is the region the visual pooler reads.
"""

import keras
from keras import ops

from attention_zoo_keras.layers.block_stack import block_stack
from attention_zoo_keras.layers.co_attention import CoAttentionBlock
from attention_zoo_keras.layers.embedding import Embedding
from attention_zoo_keras.layers.fused_keras_layers import Dense
from attention_zoo_keras.layers.fused_keras_layers import LayerNormalization
from attention_zoo_keras.layers.initializers import clone_initializer
from attention_zoo_keras.layers.position_embedding import PositionEmbedding
from attention_zoo_keras.layers.transformer_encoder_block import TransformerEncoderBlock
from attention_zoo_keras.models.backbone import Backbone
from attention_zoo_keras.models.input_validation import check_id_range
from attention_zoo_keras.models.input_validation import check_mask
from attention_zoo_keras.models.input_validation import check_token_inputs
from attention_zoo_keras.models.input_validation import concrete_shape
from attention_zoo_keras.models.vilbert.vilbert_co_attention_schedule import check_co_attention_schedule
from attention_zoo_keras.models.vilbert.vilbert_co_attention_schedule import run_co_attention_schedule
from attention_zoo_keras.registration import register

BOX_DIM = 5


@register
class ViLBERTBackbone(Backbone):
    """The ViLBERT two-stream encoder: text and region embeddings, single-stream
    BERT layers in each stream, co-attention layers between them, two poolers.

    Args:
        vocabulary_size: int. The number of token ids.
        num_layers: int. The text-stream BERT layers.
        num_heads: int. The attention heads of the text layers.
        hidden_dim: int. The width of the text stream.
        intermediate_dim: int. The feed-forward width of the text stream
            (also in the co-attention layers).
        region_feature_dim: int. The width of the input region features
            (2048 for the authors' Faster R-CNN features).
        visual_num_layers: int. The visual-stream BERT layers.
        visual_num_heads: int. The attention heads of the visual layers.
        visual_hidden_dim: int. The width of the visual stream.
        visual_intermediate_dim: int. The feed-forward width of the visual
            stream.
        co_attention_dim: int. The width of the co-attention queries, keys
            and values, and of both pooled outputs.
        co_attention_num_heads: int. The heads of each co-attention.
        co_attention_text_layers: list of int. For each co-attention layer,
            how many text layers run before it (a cumulative count).
        co_attention_visual_layers: list of int. The same for the visual
            layers.
        dropout: float. Dropout on the text stream's residual branches, and
            on both embeddings (the authors' region embeddings use the text
            rate).
        attention_dropout: float. Dropout on attention probabilities over
            tokens.
        visual_dropout: float. Dropout on the visual stream's residual
            branches.
        visual_attention_dropout: float. Dropout on attention probabilities
            over regions.
        max_sequence_length: int. The number of learned text positions.
        num_segments: int. The number of segment (token type) ids.
        activation: str. The feed-forward activation of the text stream.
        visual_activation: str. The feed-forward activation of the visual
            stream.
        layer_norm_epsilon: float. The epsilon of every layer norm.
        initializer_range: float. The standard deviation of the
            truncated-normal init.
        num_task_tokens: int. With a positive count, the model takes `task_ids`
            and inserts that task's learned embedding after `[CLS]` (no
            position or segment embedding added to it), as the authors'
            multi-task model (Lu et al., 2020, "12-in-1") does with 20
            task tokens; the text outputs are then one position longer.
        dtype: str, `keras.DTypePolicy` or None. The dtype policy of every
            layer, e.g. `"bfloat16"`.

    Names of the authors' `BertConfig` (facebookresearch/vilbert-multi-task):
    `num_layers` = `num_hidden_layers`, `visual_num_layers` =
    `v_num_hidden_layers`, `region_feature_dim` = `v_feature_size`,
    `visual_*` = `v_*`, `co_attention_dim` = `bi_hidden_size`,
    `co_attention_num_heads` = `bi_num_attention_heads`,
    `co_attention_text_layers` = `t_biattention_id`,
    `co_attention_visual_layers` = `v_biattention_id`
    (see `vilbert_convert.vilbert_backbone_config`).

    Inputs: a dict of `token_ids`, `segment_ids`, `padding_mask`, each
    `(batch, length)` int; `region_features` `(batch, regions,
    region_feature_dim)` float; `region_boxes` `(batch, regions, 5)` float;
    `region_mask` `(batch, regions)` int, 1 on real regions; with task
    tokens also `task_ids` `(batch, 1)` int. Outputs: a dict
    of `sequence_output` `(batch, length, hidden_dim)`,
    `visual_sequence_output` `(batch, regions, visual_hidden_dim)`,
    `pooled_output` and `visual_pooled_output`, each `(batch, co_attention_dim)`.

    Example:

    >>> import numpy as np
    >>> backbone = ViLBERTBackbone(
    ...     vocabulary_size=50, num_layers=2, num_heads=2, hidden_dim=8, intermediate_dim=16,
    ...     region_feature_dim=6, visual_num_layers=2, visual_num_heads=2, visual_hidden_dim=4,
    ...     visual_intermediate_dim=8, co_attention_dim=4, co_attention_num_heads=2,
    ...     co_attention_text_layers=[1, 2], co_attention_visual_layers=[0, 1],
    ...     max_sequence_length=8)
    >>> ids = np.array([[2, 15, 27, 3, 0]])
    >>> out = backbone({"token_ids": ids, "segment_ids": np.zeros_like(ids),
    ...                 "padding_mask": (ids > 0).astype("int32"),
    ...                 "region_features": np.ones((1, 3, 6), "float32"),
    ...                 "region_boxes": np.tile(np.array([0, 0, 1, 1, 1], "float32"), (1, 3, 1)),
    ...                 "region_mask": np.ones((1, 3), "int32")})
    >>> {name: tuple(value.shape) for name, value in sorted(out.items())}
    {'pooled_output': (1, 4), 'sequence_output': (1, 5, 8), 'visual_pooled_output': (1, 4), 'visual_sequence_output': (1, 3, 4)}
    """

    family = "vilbert"
    # Megatron layouts of its own weights (see `models.layout_maps`): the
    # region and box projections into the visual stream, like token embeddings.
    family_layout_rules = (
        (r"(region|box)_embedding/kernel", (None, "model")),
        (r"(region|box)_embedding/bias", ("model",)),
    )

    def __init__(
        self,
        vocabulary_size,
        num_layers,
        num_heads,
        hidden_dim,
        intermediate_dim,
        region_feature_dim,
        visual_num_layers,
        visual_num_heads,
        visual_hidden_dim,
        visual_intermediate_dim,
        co_attention_dim,
        co_attention_num_heads,
        co_attention_text_layers,
        co_attention_visual_layers,
        dropout=0.1,
        attention_dropout=0.1,
        visual_dropout=0.1,
        visual_attention_dropout=0.1,
        max_sequence_length=512,
        num_segments=2,
        activation="gelu",
        visual_activation="gelu",
        layer_norm_epsilon=1e-12,
        initializer_range=0.02,
        num_task_tokens=0,
        dtype=None,
        **kwargs,
    ):
        co_attention_text_layers = [int(i) for i in co_attention_text_layers]
        co_attention_visual_layers = [int(i) for i in co_attention_visual_layers]
        check_co_attention_schedule(
            co_attention_text_layers, co_attention_visual_layers, num_layers, visual_num_layers
        )

        # === Layers ===
        initializer = keras.initializers.TruncatedNormal(stddev=initializer_range)

        def embedding(count, name):
            return Embedding(
                count, hidden_dim, embeddings_initializer=clone_initializer(initializer),
                dtype=dtype, name=name,
            )

        def dense(units, name, activation=None):
            return Dense(
                units, activation=activation, kernel_initializer=clone_initializer(initializer),
                dtype=dtype, name=name,
            )

        def layer_norm(name):
            return LayerNormalization(epsilon=layer_norm_epsilon, dtype=dtype, name=name)

        token_embedding = embedding(vocabulary_size, "token_embedding")
        position_embedding = PositionEmbedding(
            max_sequence_length, hidden_dim, initializer=clone_initializer(initializer),
            dtype=dtype, name="position_embedding",
        )
        segment_embedding = embedding(num_segments, "segment_embedding")
        embeddings_norm = layer_norm("embeddings_norm")
        embeddings_dropout = keras.layers.Dropout(dropout, dtype=dtype, name="embeddings_dropout")
        region_embedding = dense(visual_hidden_dim, "region_embedding")
        box_embedding = dense(visual_hidden_dim, "box_embedding")
        visual_embeddings_norm = layer_norm("visual_embeddings_norm")
        visual_embeddings_dropout = keras.layers.Dropout(dropout, dtype=dtype, name="visual_embeddings_dropout")
        text_blocks = block_stack(
            TransformerEncoderBlock, num_layers, initializer, num_heads=num_heads, intermediate_dim=intermediate_dim,
            activation=activation, dropout=dropout, attention_dropout=attention_dropout,
            layer_norm_epsilon=layer_norm_epsilon, dtype=dtype,
        )
        visual_blocks = block_stack(
            TransformerEncoderBlock, visual_num_layers, initializer, name="visual_transformer_layer",
            num_heads=visual_num_heads, intermediate_dim=visual_intermediate_dim, activation=visual_activation,
            dropout=visual_dropout, attention_dropout=visual_attention_dropout, layer_norm_epsilon=layer_norm_epsilon,
            dtype=dtype,
        )
        co_attention_blocks = block_stack(
            CoAttentionBlock,
            len(co_attention_text_layers),
            initializer,
            name="co_attention_layer",
            num_heads=co_attention_num_heads,
            co_attention_dim=co_attention_dim,
            text_intermediate_dim=intermediate_dim,
            visual_intermediate_dim=visual_intermediate_dim,
            text_activation=activation,
            visual_activation=visual_activation,
            text_dropout=dropout,
            visual_dropout=visual_dropout,
            text_attention_dropout=attention_dropout,
            visual_attention_dropout=visual_attention_dropout,
            layer_norm_epsilon=layer_norm_epsilon,
            dtype=dtype,
        )
        pooler = dense(co_attention_dim, "pooler", activation="relu")
        visual_pooler = dense(co_attention_dim, "visual_pooler", activation="relu")

        # === Functional Model ===
        token_ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
        segment_ids = keras.Input(shape=(None,), dtype="int32", name="segment_ids")
        padding_mask = keras.Input(shape=(None,), dtype="int32", name="padding_mask")
        region_features = keras.Input(shape=(None, region_feature_dim), name="region_features")
        region_boxes = keras.Input(shape=(None, BOX_DIM), name="region_boxes")
        region_mask = keras.Input(shape=(None,), dtype="int32", name="region_mask")
        inputs = {
            "token_ids": token_ids,
            "segment_ids": segment_ids,
            "padding_mask": padding_mask,
            "region_features": region_features,
            "region_boxes": region_boxes,
            "region_mask": region_mask,
        }

        text = token_embedding(token_ids) + position_embedding(token_ids) + segment_embedding(segment_ids)
        if num_task_tokens:
            task_embedding = embedding(num_task_tokens, "task_embedding")
            inputs["task_ids"] = keras.Input(shape=(1,), dtype="int32", name="task_ids")
            text = ops.concatenate([text[:, :1], task_embedding(inputs["task_ids"]), text[:, 1:]], axis=1)
            padding_mask = ops.concatenate([ops.ones_like(padding_mask[:, :1]), padding_mask], axis=1)
        text = embeddings_dropout(embeddings_norm(text))
        visual = region_embedding(region_features) + box_embedding(region_boxes)
        visual = visual_embeddings_dropout(visual_embeddings_norm(visual))
        text_mask = ops.expand_dims(ops.cast(padding_mask, "bool"), axis=1)
        visual_mask = ops.expand_dims(ops.cast(region_mask, "bool"), axis=1)

        text, visual = run_co_attention_schedule(
            text, visual, text_mask, visual_mask, (text_blocks, visual_blocks, co_attention_blocks),
            (co_attention_text_layers, co_attention_visual_layers),
        )
        pooled = pooler(text[:, 0, :])
        visual_pooled = visual_pooler(visual[:, 0, :])

        super().__init__(
            inputs=inputs,
            outputs={
                "sequence_output": text,
                "visual_sequence_output": visual,
                "pooled_output": pooled,
                "visual_pooled_output": visual_pooled,
            },
            dtype=dtype,
            **kwargs,
        )
        self.token_embedding = token_embedding

        # === Config ===
        self.vocabulary_size = vocabulary_size
        self.num_layers = num_layers
        self.num_heads = num_heads
        self.hidden_dim = hidden_dim
        self.intermediate_dim = intermediate_dim
        self.region_feature_dim = region_feature_dim
        self.visual_num_layers = visual_num_layers
        self.visual_num_heads = visual_num_heads
        self.visual_hidden_dim = visual_hidden_dim
        self.visual_intermediate_dim = visual_intermediate_dim
        self.co_attention_dim = co_attention_dim
        self.co_attention_num_heads = co_attention_num_heads
        self.co_attention_text_layers = co_attention_text_layers
        self.co_attention_visual_layers = co_attention_visual_layers
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.visual_dropout = visual_dropout
        self.visual_attention_dropout = visual_attention_dropout
        self.max_sequence_length = max_sequence_length
        self.num_segments = num_segments
        self.activation = activation
        self.visual_activation = visual_activation
        self.layer_norm_epsilon = layer_norm_epsilon
        self.initializer_range = initializer_range
        self.num_task_tokens = num_task_tokens

    def unused_layers(self, output_names):
        """`Backbone.unused_layers`, and the half of the last co-attention
        layer that computes a stream no named output reads (its text half
        for a model that reads only the visual stream)."""
        output_names = list(output_names)
        unused = super().unused_layers(output_names)
        last_co_attention = self.get_layer(f"co_attention_layer_{len(self.co_attention_text_layers) - 1}")
        streams = {"text": ("sequence_output", "pooled_output"),
                   "visual": ("visual_sequence_output", "visual_pooled_output")}
        for stream, outputs in streams.items():
            if not set(outputs) & set(output_names):
                unused += last_co_attention.stream_layers(stream)
        return unused

    def validate_inputs(self, inputs):
        check_token_inputs(inputs, self.vocabulary_size, self.max_sequence_length, num_segments=self.num_segments)
        if inputs.get("region_mask") is not None:
            check_mask("region_mask", inputs["region_mask"])
        if self.num_task_tokens and "task_ids" in inputs:
            check_id_range("task_ids", inputs["task_ids"], self.num_task_tokens)
        shapes = {name: concrete_shape(value) for name, value in inputs.items()}
        features = shapes.get("region_features")
        if features is not None and (len(features) != 3 or features[-1] != self.region_feature_dim):
            raise ValueError(
                f"'region_features' must be (batch, regions, {self.region_feature_dim}); got shape {features}."
            )
        boxes = shapes.get("region_boxes")
        if boxes is not None and (len(boxes) != 3 or boxes[-1] != BOX_DIM):
            raise ValueError(
                "'region_boxes' must be (batch, regions, 5): x1, y1, x2, y2 and area, normalised by the "
                f"image size; got shape {boxes}."
            )
        batches = {name: shape[0] for name, shape in shapes.items() if shape}
        if len(set(batches.values())) > 1:
            raise ValueError(
                "Every input must have the same batch size (one image per text); got "
                + ", ".join(f"{name}: {size}" for name, size in batches.items())
                + "."
            )
        regions = {
            name: shapes[name][1] for name in ("region_features", "region_boxes", "region_mask")
            if name in shapes and len(shapes[name]) >= 2
        }
        if len(set(regions.values())) > 1:
            raise ValueError(
                "'region_features', 'region_boxes' and 'region_mask' must have the same number of regions; got "
                + ", ".join(f"{name}: {size}" for name, size in regions.items())
                + "."
            )

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "vocabulary_size": self.vocabulary_size,
                "num_layers": self.num_layers,
                "num_heads": self.num_heads,
                "hidden_dim": self.hidden_dim,
                "intermediate_dim": self.intermediate_dim,
                "region_feature_dim": self.region_feature_dim,
                "visual_num_layers": self.visual_num_layers,
                "visual_num_heads": self.visual_num_heads,
                "visual_hidden_dim": self.visual_hidden_dim,
                "visual_intermediate_dim": self.visual_intermediate_dim,
                "co_attention_dim": self.co_attention_dim,
                "co_attention_num_heads": self.co_attention_num_heads,
                "co_attention_text_layers": list(self.co_attention_text_layers),
                "co_attention_visual_layers": list(self.co_attention_visual_layers),
                "dropout": self.dropout,
                "attention_dropout": self.attention_dropout,
                "visual_dropout": self.visual_dropout,
                "visual_attention_dropout": self.visual_attention_dropout,
                "max_sequence_length": self.max_sequence_length,
                "num_segments": self.num_segments,
                "activation": self.activation,
                "visual_activation": self.visual_activation,
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "initializer_range": self.initializer_range,
                "num_task_tokens": self.num_task_tokens,
            }
        )
        return config
