"""Layout maps for `keras.distribution.ModelParallel`: Megatron-style tensor
parallelism (Shoeybi et al., 2019, "Megatron-LM: Training Multi-Billion
Parameter Language Models Using Model Parallelism") for every backbone.

Each Transformer block splits over the mesh's model axis so that its two
matrix products need one all-reduce each, and its non-linearities run on
local shards:

- attention: the `query`, `key` and `value` projections are column-parallel
  (kernel `(in, out)` sharded on `out`, bias on its only axis), which gives
  each device a contiguous block of heads; the attention `output`
  projection is row-parallel (kernel sharded on `in`), so the heads' partial
  outputs are summed across devices. The output bias is replicated (added
  once, after the sum).
- feed-forward: `intermediate` is column-parallel and the activation runs on
  each device's slice of the intermediate features; `output` is
  row-parallel.
- token embeddings are sharded on the hidden axis, `(None, model)`, not on
  the vocabulary: vocabulary sizes are rarely multiples of a device count
  (30522 for BERT, 50257 for GPT-2, 267735 for Transformer-XL), hidden
  widths always are; a lookup then yields hidden-sharded rows with no
  communication, and a tied output head contracts over the sharded axis
  (one all-reduce).

Everything else (layer norms, position embeddings, poolers, task heads) is
replicated, and no weight is sharded over the data axis: under
`ModelParallel(layout_map=..., batch_dim_name=data_axis)` the batch splits
over the data axis and the weights over the model axis only. XLA inserts
the collectives; every rule below is a layout, never a change in the
computation, so a sharded model computes what the single-device one does.

The rules are regular expressions that must match a variable's whole path
(`keras.distribution.LayoutMap` semantics, each path matching one rule at
most). Every family names its layers alike (`transformer_layer_0/
self_attention/query/kernel`, `.../feed_forward/intermediate/kernel`,
`token_embedding/embeddings`), so `GENERIC_LAYOUT_RULES` covers the blocks of
every family, cross-attention (`cross_attention`, ViLBERT's
`text_cross_attention` and `visual_cross_attention`) and Reformer's LSH
attention (whose shared query-key projection is its `query`) included. A
backbone class adds the rules of its family's own weights in the class
attribute `family_layout_rules`, in the same form (`"model"` naming the
sharded axis), each sharding the axis a Megatron split implies:

- Transformer-XL: the relative position projection `W_R` column-parallel
  (like `W_k`); the biases u, v `(heads, head_dim)` by head, per layer or
  shared; the adaptive input tables on their width, their projections to
  the hidden width row-parallel; the adaptive softmax's own tables and
  cluster weights on their width, its projections column-parallel.
- Reformer: the axial position embeddings on their width.
- ViLBERT: the region and box projections into the visual stream
  column-parallel (its visual blocks and co-attention layers follow the
  generic rules).
- ViT: the patch projection on its output channels.
- Transformer (seq2seq): a separate target vocabulary's embeddings on the
  hidden axis.
- BERT and GPT need none.
"""

import types

import keras

MODEL_AXIS = "model"
"""How a rule names the sharded axis; replaced by the mesh's model axis."""

GENERIC_LAYOUT_RULES = (
    (r".*/(query|key|value|intermediate)/kernel", (None, MODEL_AXIS)),  # column-parallel
    (r".*/(query|key|value|intermediate)/bias", (MODEL_AXIS,)),
    (r".*(attention|feed_forward)/output/kernel", (MODEL_AXIS, None)),  # row-parallel
    (r"token_embedding/embeddings", (None, MODEL_AXIS)),  # on the hidden axis
)
"""`(path pattern, axes)` of the weights every family names alike."""


class class_or_instance_method:
    """A method that receives the class when called on the class and the
    instance when called on an instance."""

    def __init__(self, function):
        self.function = function
        self.__doc__ = function.__doc__

    def __get__(self, instance, owner):
        return types.MethodType(self.function, owner if instance is None else instance)


def _is_divisible(shape, axes, model_axis, model_axis_size):
    """Whether every axis of `shape` that `axes` shards over `model_axis`
    splits evenly into `model_axis_size` pieces."""
    return all(size % model_axis_size == 0 for size, axis in zip(shape, axes) if axis == model_axis)


class Distributable:
    """Mixin for backbones: `get_layout_map`, the Megatron layout of the
    backbone's weights for `keras.distribution.ModelParallel`.

    A subclass lists the layouts of its family's own weights in
    `family_layout_rules`, `(path pattern, axes)` pairs with `MODEL_AXIS`
    (`"model"`) for the sharded axis (see the module docstring).
    """

    family_layout_rules = ()

    @class_or_instance_method
    def get_layout_map(self_or_cls, device_mesh, model_axis="model", data_axis="data"):
        """The Megatron layout of this family's weights over `device_mesh`.

        Called on the class, the map holds the rules as path patterns, for a
        model built (or loaded from a preset) inside the distribution's
        scope; the sizes it shards (hidden, intermediate and head widths,
        head counts) must then be multiples of the model axis' size, or
        building the model fails (an axis that does not split evenly cannot
        be sharded). Called on a built backbone, the map also replicates
        those of its variables whose sharded axis the model axis' size does
        not divide, so it fits any configuration; a task head's own
        variables (the untied tables of Transformer-XL's adaptive softmax)
        are not the backbone's and keep the patterns.

        Args:
            device_mesh: keras.distribution.DeviceMesh. The mesh to lay
                the weights out over.
            model_axis: str. The mesh axis the weights are sharded over.
            data_axis: str. The mesh axis the batch is split over (the
                `batch_dim_name` of `ModelParallel`); checked to be another
                axis of the mesh, never used to shard weights.

        Returns:
            A `keras.distribution.LayoutMap`.

        Example:

        >>> import keras
        >>> from attention_zoo_keras.models import GPTBackbone
        >>> mesh = keras.distribution.DeviceMesh((1, 1), ["data", "model"], devices=["cpu:0"])
        >>> layout_map = GPTBackbone.get_layout_map(mesh)
        >>> layout_map["transformer_layer_0/self_attention/query/kernel"].axes    # column-parallel
        (None, 'model')
        >>> layout_map["transformer_layer_0/feed_forward/output/kernel"].axes     # row-parallel
        ('model', None)

        Training GPT-2 on 8 devices, 4 data-parallel replicas of 2 shards each:

        >>> mesh = keras.distribution.DeviceMesh((4, 2), ["data", "model"],
        ...                                      devices=keras.distribution.list_devices())  # doctest: +SKIP
        >>> distribution = keras.distribution.ModelParallel(
        ...     layout_map=GPTBackbone.get_layout_map(mesh), batch_dim_name="data")       # doctest: +SKIP
        >>> with distribution.scope():                                                    # doctest: +SKIP
        ...     lm = GPTCausalLM.from_preset("gpt2")
        ...     lm.fit(texts, batch_size=32)
        """
        axis_names = list(device_mesh.axis_names)
        for role, axis in (("model_axis", model_axis), ("data_axis", data_axis)):
            if axis not in axis_names:
                raise ValueError(f"{role}={axis!r} is not an axis of the device mesh, whose axes are {axis_names}.")
        if model_axis == data_axis:
            raise ValueError(f"model_axis and data_axis must be different mesh axes; both are {model_axis!r}.")
        layout_map = keras.distribution.LayoutMap(device_mesh)
        for pattern, axes in GENERIC_LAYOUT_RULES + tuple(self_or_cls.family_layout_rules):
            layout_map[pattern] = tuple(model_axis if axis == MODEL_AXIS else None for axis in axes)
        if isinstance(self_or_cls, type):
            return layout_map
        model_axis_size = device_mesh.shape[axis_names.index(model_axis)]
        for variable in self_or_cls.weights:
            layout = layout_map[variable.path]
            if layout is not None and not _is_divisible(variable.shape, layout.axes, model_axis, model_axis_size):
                layout_map[variable.path] = (None,) * len(variable.shape)
        return layout_map
