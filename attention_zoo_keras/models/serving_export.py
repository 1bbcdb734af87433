"""`model.export` for serving, Keras' own exporter made dependable on every
backend (see `backend_support.litert_export_settings`).

From JAX, a SavedModel whose input sizes are left unknown (no
`input_signature`) is converted by `jax2tf` with one symbol per unknown
size. Keras names every unknown size apart, so the converter cannot know
that a padding mask is as long as its token ids, and fails where the graph
combines them. Here the sizes that must be equal share a symbol: `batch`;
the text's length (`token_ids`, `segment_ids`, `padding_mask`); the source
(`encoder_*`) and target (`decoder_*`) lengths; the number of regions
(`region_*`); a task's own shared axes (`serving_shared_axes`, ViLBERT
retrieval's candidates). Any other unknown size is the input's own.

From torch, an ONNX file without `input_signature` gets the model's own
inputs as its signature (named, their unknown sizes unknown), where Keras
would ask for a model that was called once.
"""

import keras

from attention_zoo_keras.backend_support import litert_export_settings

# Inputs whose unknown axes are one group's: (name prefix, group).
_GROUPS_BY_PREFIX = (("encoder_", "source"), ("decoder_", "target"), ("region_", "regions"))
_TEXT_INPUTS = ("token_ids", "segment_ids", "padding_mask")


def polymorphic_shapes(inputs, shared_axes=None):
    """`jax2tf`'s `polymorphic_shapes` for a model's dict of inputs: one
    shape string per input, the sizes that must be equal under one symbol
    (the module docstring names them).

    Args:
        inputs: dict. `{name: tensor or KerasTensor}`, shapes with `None`
            for unknown sizes.
        shared_axes: dict or None. `{axis: symbol}`, axes every input shares.

    >>> import keras
    >>> polymorphic_shapes({"token_ids": keras.KerasTensor((None, None)),
    ...                     "region_boxes": keras.KerasTensor((None, None, 5))})
    {'token_ids': '(batch, length1)', 'region_boxes': '(batch, regions1, 5)'}
    """
    shared_axes = shared_axes or {}

    def shape_of(name, shape):
        group = next((group for prefix, group in _GROUPS_BY_PREFIX if name.startswith(prefix)), None)
        group = group or ("length" if name in _TEXT_INPUTS else name)
        sizes = [
            str(size) if size is not None else "batch" if axis == 0 else shared_axes.get(axis, f"{group}{axis}")
            for axis, size in enumerate(shape)
        ]
        return f"({', '.join(sizes)})"

    return {name: shape_of(name, tuple(tensor.shape)) for name, tensor in inputs.items()}


class ServingExport:
    """Mixin for backbones and tasks: Keras' `export`, which LiteRT from
    torch can call more than once in a process, and which from JAX serves
    any input size (see the module docstring)."""

    # `{axis: symbol}`: unknown axes all of a task's inputs share.
    serving_shared_axes = {}

    def export(self, filepath, format="tf_saved_model", verbose=None, input_signature=None, **kwargs):
        """Keras' `Model.export`: a TensorFlow SavedModel, ONNX, OpenVINO or
        LiteRT file of the model's forward pass (what Keras supports on the
        backend: LiteRT from TensorFlow, or from torch with the
        `litert-torch` package; ONNX from torch). Tested for every
        family's task by running the exported file (the Reformer's LiteRT
        file needs TensorFlow's Select ops from TensorFlow, and does not
        convert from torch).

        Without `input_signature`, a SavedModel serves any batch size and
        length, from TensorFlow and from JAX, and so does an ONNX file from
        torch (its inputs named as the model's). From JAX, a Reformer (whose
        padding to its chunk length depends on the length) needs fixed
        shapes; so do, for ONNX from torch, the Reformer and the masked
        language models (torch's ONNX exporter of unknown sizes has no
        `take_along_dim`).

        Args:
            filepath: str. Where to write.
            format: str. `"tf_saved_model"`, `"onnx"`, `"openvino"` or
                `"litert"`.
            verbose: bool or None. Whether Keras prints its progress.
            input_signature: list or None. `keras.InputSpec`s of the inputs
                (fixed shapes for LiteRT); `None`: the model's inputs, their
                unknown sizes left unknown.
            **kwargs: dict. Passed on to Keras' exporter.

        Raises:
            ValueError: from JAX or torch, for a model whose graph cannot be
                converted with its sizes unknown, saying to give fixed ones.

        Example:

        >>> import keras
        >>> signature = [{"token_ids": keras.InputSpec(shape=(1, 8), dtype="int32"),
        ...               "padding_mask": keras.InputSpec(shape=(1, 8), dtype="int32")}]
        >>> classifier.export("model.tflite", format="litert", input_signature=signature)  # doctest: +SKIP
        """
        unknown_sizes = self._jax_symbolic_sizes(format, input_signature, kwargs)
        if keras.backend.backend() == "torch" and format == "onnx" and input_signature is None:
            input_signature, unknown_sizes = self._own_input_signature(), True
        with litert_export_settings(format):
            try:
                return super().export(
                    filepath, format=format, verbose=verbose, input_signature=input_signature, **kwargs
                )
            except Exception as error:
                if not unknown_sizes or isinstance(error, OSError):  # (a file that cannot be written says so itself)
                    raise
                raise ValueError(
                    f"Exporting this {type(self).__name__} from {keras.backend.backend()} with its input sizes "
                    f"unknown failed ({type(error).__name__}: {str(error).strip().splitlines()[0]}). Give "
                    "`input_signature` with fixed shapes (keras.InputSpec(shape=(batch, length), ...) for each "
                    "input)."
                ) from error

    def _own_input_signature(self):
        """The model's inputs as `keras.InputSpec`s, named, their unknown
        sizes unknown (Keras' ONNX exporter from torch otherwise asks for a
        model that was called once, and names the inputs `input_0`, …)."""
        return [keras.tree.map_structure(
            lambda tensor: keras.InputSpec(shape=tensor.shape, dtype=tensor.dtype, name=tensor.name),
            self._inputs_struct,
        )]

    def _jax_symbolic_sizes(self, format, input_signature, kwargs):
        """Under JAX, for a SavedModel of unknown sizes, puts shared symbols
        into `kwargs["jax2tf_kwargs"]` (unless the caller gave
        `polymorphic_shapes`); whether it did."""
        inputs = getattr(self, "_inputs_struct", None)
        if keras.backend.backend() != "jax" or format != "tf_saved_model" or input_signature is not None:
            return False
        if not isinstance(inputs, dict) or "polymorphic_shapes" in (kwargs.get("jax2tf_kwargs") or {}):
            return False
        kwargs["jax2tf_kwargs"] = {
            **(kwargs.get("jax2tf_kwargs") or {}),
            "polymorphic_shapes": [polymorphic_shapes(inputs, self.serving_shared_axes)],
        }
        return True
