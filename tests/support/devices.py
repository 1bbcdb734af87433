"""Which device the tests run on: the CUDA tests run only where torch sees a
GPU (the device machine; see docs/benchmarks.md), not in CI, which has none."""

import keras
import pytest


def torch_sees_cuda():
    """Whether the backend is torch and torch sees a CUDA GPU (where Keras
    then places every tensor)."""
    if keras.backend.backend() != "torch":
        return False
    import torch

    return torch.cuda.is_available()


needs_cuda = pytest.mark.skipif(not torch_sees_cuda(), reason="needs torch with a CUDA GPU")
