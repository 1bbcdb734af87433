"""`model.export` for serving, Keras' own exporter made dependable on every
backend (see `backend_support.litert_export_settings`)."""

from attention_zoo_keras.backend_support import litert_export_settings


class ServingExport:
    """Mixin for backbones and tasks: Keras' `export`, which LiteRT from
    torch can call more than once in a process."""

    def export(self, filepath, format="tf_saved_model", verbose=None, input_signature=None, **kwargs):
        """Keras' `Model.export`: a TensorFlow SavedModel, ONNX, OpenVINO or
        LiteRT file of the model's forward pass (what Keras supports on the
        backend: LiteRT from TensorFlow, or from torch with the
        `litert-torch` package; ONNX from torch). Tested for every
        family's task by running the exported file (the Reformer's LiteRT
        file needs TensorFlow's Select ops from TensorFlow, and does not
        convert from torch).

        Args:
            filepath: str. Where to write.
            format: str. `"tf_saved_model"`, `"onnx"`, `"openvino"` or
                `"litert"`.
            verbose: bool or None. Whether Keras prints its progress.
            input_signature: list or None. `keras.InputSpec`s of the inputs
                (fixed shapes for LiteRT).
            **kwargs: dict. Passed on to Keras' exporter.

        Example:

        >>> import keras
        >>> signature = [{"token_ids": keras.InputSpec(shape=(1, 8), dtype="int32"),
        ...               "padding_mask": keras.InputSpec(shape=(1, 8), dtype="int32")}]
        >>> classifier.export("model.tflite", format="litert", input_signature=signature)  # doctest: +SKIP
        """
        with litert_export_settings(format):
            return super().export(filepath, format=format, verbose=verbose, input_signature=input_signature, **kwargs)
