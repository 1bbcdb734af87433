"""The Vision Transformer (Dosovitskiy et al., 2021, "An Image is Worth 16x16
Words: Transformers for Image Recognition at Scale"): a pre-norm Transformer
encoder over a class token and the image's patches.

    z_0 = Dropout([x_class; x_p^1 E; …; x_p^N E] + E_pos)
    z_l = z_{l-1} + MSA(LN(z_{l-1}));  z_l += MLP(LN(z_l)),   l = 1..L
    out = LN(z_L);   pooled = tanh(W_p out_0 + b_p)  (optional)

The pooler is `transformers`' `ViTPooler`; the paper classifies from
LN(z_L)_0 directly, as `ViTForImageClassification` does.
"""

import keras
import numpy as np
from keras import ops

from attention_zoo_keras.layers.block_stack import block_stack
from attention_zoo_keras.layers.fused_keras_layers import Dense
from attention_zoo_keras.layers.fused_keras_layers import LayerNormalization
from attention_zoo_keras.layers.initializers import clone_initializer
from attention_zoo_keras.layers.patch_embedding import PatchEmbedding
from attention_zoo_keras.layers.patch_embedding import as_pair
from attention_zoo_keras.layers.transformer_encoder_block import TransformerEncoderBlock
from attention_zoo_keras.models.backbone import Backbone
from attention_zoo_keras.models.vit.vit_position_embedding import ViTPositionEmbedding
from attention_zoo_keras.registration import register


@register
class ClassToken(keras.layers.Layer):
    """Prepends one learned vector to every sequence: `[x_class; z_1; …; z_N]`.

    Args:
        initializer: str or `keras.initializers.Initializer`. The initializer
            of the token (weight `embedding`, `(dim,)`).

    Call args:
        inputs: tensor of shape `(batch, length, dim)`. The patch tokens.

    Returns:
        `(batch, 1 + length, dim)`.

    Example:

    >>> import numpy as np
    >>> tuple(ClassToken()(np.zeros((2, 5, 8), "float32")).shape)
    (2, 6, 8)
    """

    def __init__(self, initializer="zeros", **kwargs):
        super().__init__(**kwargs)
        self.initializer = keras.initializers.get(initializer)

    def build(self, input_shape):
        self.embedding = self.add_weight(name="embedding", shape=(input_shape[-1],), initializer=self.initializer)

    def call(self, inputs):
        batch, dim = ops.shape(inputs)[0], ops.shape(inputs)[-1]
        token = ops.broadcast_to(ops.cast(self.embedding, self.compute_dtype), (batch, 1, dim))
        return ops.concatenate([token, inputs], axis=1)

    def compute_output_shape(self, input_shape):
        length = None if input_shape[1] is None else input_shape[1] + 1
        return (input_shape[0], length, input_shape[2])

    def get_config(self):
        config = super().get_config()
        config["initializer"] = keras.initializers.serialize(self.initializer)
        return config


@register
class ViTBackbone(Backbone):
    """The ViT encoder: patch embedding, class token, learned position
    embeddings, pre-norm Transformer blocks, a final layer norm and, if
    `use_pooler`, `transformers`' tanh pooler.

    Args:
        image_size: int or tuple of int. The input height and width, an int
            or a `(height, width)` pair.
        patch_size: int or tuple of int. The patch height and width, an int
            or a pair.
        num_channels: int. The channels of the input images.
        num_layers: int. The number of encoder blocks.
        num_heads: int. The attention heads per block.
        hidden_dim: int. The width of the hidden states.
        intermediate_dim: int. The feed-forward width.
        dropout: float. Dropout on embeddings and residual branches.
        attention_dropout: float. Dropout on attention probabilities.
        layer_norm_epsilon: float. The epsilon of every layer norm.
        activation: str. The feed-forward activation (`"gelu"` is the exact
            GELU).
        attention: str. The attention mechanism's name (see
            `attention.mechanism_names()`), `"softmax"` for ViT.
        attention_options: dict or None. The mechanism's options (see
            `MultiHeadAttention`).
        use_pooler: bool. Add `pooled_output = tanh(Dense(class token))`.
        initializer_range: float. The standard deviation of the
            truncated-normal init.
        dtype: str, `keras.DTypePolicy` or None. The dtype policy of every
            layer, e.g. `"bfloat16"`.

    Inputs: a dict with one entry, `images`: float `(batch, height, width,
    channels)`, channels last, already rescaled and normalised — a dict like
    every backbone's, so a preprocessor's features feed it unchanged and
    concrete inputs are checked. Outputs: a dict of `sequence_output`
    `(batch, 1 + num_patches, hidden_dim)` (the class token first, then the
    patches in row-major order) and, with `use_pooler`, `pooled_output`
    `(batch, hidden_dim)`.

    `ViTBackbone.from_preset(preset, image_size=384)` builds the model for
    another resolution and resizes the checkpoint's patch position grid
    bicubically (the class position kept), as `transformers`'
    `interpolate_pos_encoding=True` does (`ViTConverter.adapt_arrays`);
    `get_config()` then reports the new size and a saved preset reloads at it.

    Example:

    >>> import numpy as np
    >>> backbone = ViTBackbone(image_size=32, patch_size=8, num_layers=2, num_heads=2,
    ...                        hidden_dim=16, intermediate_dim=32, use_pooler=True)
    >>> out = backbone({"images": np.zeros((1, 32, 32, 3), "float32")})
    >>> tuple(out["sequence_output"].shape), tuple(out["pooled_output"].shape)
    ((1, 17, 16), (1, 16))
    """

    family = "vit"
    # Megatron layouts of its own weights (see `models.layout_maps`): the
    # patch projection, like token embeddings, on the hidden axis.
    family_layout_rules = (
        (r"patch_embedding/projection/kernel", (None, None, None, "model")),
        (r"patch_embedding/projection/bias", ("model",)),
    )

    def __init__(
        self,
        image_size=224,
        patch_size=16,
        num_channels=3,
        num_layers=12,
        num_heads=12,
        hidden_dim=768,
        intermediate_dim=3072,
        dropout=0.0,
        attention_dropout=0.0,
        layer_norm_epsilon=1e-12,
        activation="gelu",
        attention="softmax",
        attention_options=None,
        use_pooler=False,
        initializer_range=0.02,
        dtype=None,
        **kwargs,
    ):
        image_size = as_pair(image_size, "image_size")
        patch_size = as_pair(patch_size, "patch_size")
        if image_size[0] < patch_size[0] or image_size[1] < patch_size[1]:
            raise ValueError(
                f"image_size {image_size} is smaller than patch_size {patch_size}: an image must "
                "hold at least one patch."
            )
        grid_size = (image_size[0] // patch_size[0], image_size[1] // patch_size[1])

        # === Layers ===
        initializer = keras.initializers.TruncatedNormal(stddev=initializer_range)
        patch_embedding = PatchEmbedding(
            patch_size, hidden_dim, kernel_initializer=clone_initializer(initializer),
            dtype=dtype, name="patch_embedding",
        )
        class_token = ClassToken(initializer=clone_initializer(initializer), dtype=dtype, name="class_token")
        position_embedding = ViTPositionEmbedding(
            grid_size, hidden_dim, initializer=clone_initializer(initializer),
            dtype=dtype, name="position_embedding",
        )
        embeddings_dropout = keras.layers.Dropout(dropout, dtype=dtype, name="embeddings_dropout")
        blocks = block_stack(
            TransformerEncoderBlock, num_layers, initializer, num_heads=num_heads, intermediate_dim=intermediate_dim,
            activation=activation, dropout=dropout, attention_dropout=attention_dropout, norm_first=True,
            layer_norm_epsilon=layer_norm_epsilon, attention=attention, attention_options=attention_options, dtype=dtype,
        )
        final_norm = LayerNormalization(epsilon=layer_norm_epsilon, dtype=dtype, name="final_norm")
        pooler = None
        if use_pooler:
            pooler = Dense(
                hidden_dim, activation="tanh", kernel_initializer=clone_initializer(initializer),
                dtype=dtype, name="pooler",
            )

        # === Functional Model ===
        images = keras.Input(shape=(*image_size, num_channels), name="images")
        x = class_token(patch_embedding(images))
        x = embeddings_dropout(x + position_embedding(x))
        for block in blocks:
            x = block(x)
        x = final_norm(x)
        outputs = {"sequence_output": x}
        if pooler is not None:
            outputs["pooled_output"] = pooler(x[:, 0, :])

        super().__init__(inputs={"images": images}, outputs=outputs, dtype=dtype, **kwargs)
        self.patch_embedding = patch_embedding
        self.class_token = class_token
        self.position_embedding = position_embedding
        self.transformer_layers = blocks
        self.final_norm = final_norm
        self.pooler = pooler

        # === Config ===
        self.grid_size = grid_size
        self.image_size = image_size
        self.patch_size = patch_size
        self.num_channels = num_channels
        self.num_layers = num_layers
        self.num_heads = num_heads
        self.hidden_dim = hidden_dim
        self.intermediate_dim = intermediate_dim
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.layer_norm_epsilon = layer_norm_epsilon
        self.activation = activation
        self.attention = attention
        self.attention_options = dict(attention_options or {})
        self.use_pooler = use_pooler
        self.initializer_range = initializer_range

    def validate_inputs(self, inputs):
        if "images" not in inputs:
            raise ValueError(f"ViTBackbone takes a dict with the key 'images'; got the keys {sorted(inputs)}.")
        shape = tuple(None if size is None else int(size) for size in np.shape(inputs["images"]))
        if len(shape) != 4:
            raise ValueError(
                f"'images' must be a batch shaped (batch, height, width, channels); got shape {shape}."
            )
        if shape[3] != self.num_channels:
            hint = ""
            if shape[1] == self.num_channels:
                hint = " It looks channels-first; transpose it to (batch, height, width, channels)."
            raise ValueError(
                f"'images' of shape {shape} has {shape[3]} channels (the last axis), but this "
                f"ViTBackbone takes {self.num_channels}.{hint}"
            )
        if shape[1:3] != self.image_size:
            raise ValueError(
                f"'images' are {shape[1:3]} (height, width), but this ViTBackbone was built for "
                f"{self.image_size} images. Resize them, or build the backbone for this size: "
                f"ViTBackbone.from_preset(preset, image_size={shape[1:3]}) interpolates the "
                "position embeddings."
            )

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "image_size": self.image_size,
                "patch_size": self.patch_size,
                "num_channels": self.num_channels,
                "num_layers": self.num_layers,
                "num_heads": self.num_heads,
                "hidden_dim": self.hidden_dim,
                "intermediate_dim": self.intermediate_dim,
                "dropout": self.dropout,
                "attention_dropout": self.attention_dropout,
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "activation": self.activation,
                "attention": self.attention,
                "attention_options": self.attention_options,
                "use_pooler": self.use_pooler,
                "initializer_range": self.initializer_range,
            }
        )
        return config
