"""Sorting that every backend's exporter can convert."""

import keras
from keras import ops

from attention_zoo_keras.backend_support.environment import backend_name


def argsort_distinct(keys):
    """The int32 indices that sort `keys` along the last axis in increasing
    order, for integer keys that are distinct along it (so that every sort
    is the stable one).

    Keras' `argsort` asks torch for a stable sort (`aten.sort.stable`),
    which torch's ONNX exporter cannot convert; under torch the sort here is
    not asked to be stable (`torch.argsort`, exported as ONNX `TopK`).
    Elsewhere it is Keras' `argsort` (a top-k in its place would not do under
    JAX: `lax.top_k` lowers to a StableHLO composite that TensorFlow's
    SavedModel runtime cannot read). A symbolic Keras tensor (a functional
    model being built) gets Keras' `argsort` for its shape.
    """
    if backend_name() == "torch" and not isinstance(keys, keras.KerasTensor):
        import torch

        return torch.argsort(ops.convert_to_tensor(keys), dim=-1).to(torch.int32)
    return ops.cast(ops.argsort(keys, axis=-1), "int32")
