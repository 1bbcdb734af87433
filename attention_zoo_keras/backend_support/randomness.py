"""The backend's own global random generator, seeded for a block of code."""

import contextlib

import keras

from attention_zoo_keras.backend_support.environment import backend_name


def seeded_global_random(seed):
    """A context in which the backend's own global random generator, if
    library code draws from it, is seeded from `seed` (a Keras seed, an
    integer tensor of shape `(2,)`), and restored afterwards.

    Only torch has such a draw: `native_fused_attention` lets
    `scaled_dot_product_attention` drop out with torch's generator. Running
    the same computation twice under the same `seed` (as a reversible
    layer's recomputation does) then drops the same entries. Elsewhere all
    randomness goes through Keras seeds and this does nothing.
    """
    if backend_name() != "torch":
        return contextlib.nullcontext()
    return _torch_seeded_global_random(seed)


@contextlib.contextmanager
def _torch_seeded_global_random(seed):
    import torch

    words = [int(word) & 0xFFFFFFFF for word in keras.ops.convert_to_numpy(seed).reshape(-1)[:2]]
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed((words[0] << 32) | words[1])
        yield
