"""Activation functions by the names checkpoints use for them.

Hugging Face configs say `"gelu"` for the exact, erf-based GELU (Hendrycks &
Gimpel, 2016: x·Φ(x)) and `"gelu_new"` / `"gelu_pytorch_tanh"` for its tanh
approximation (0.5·x·(1 + tanh(√(2/π)(x + 0.044715x³)))). `keras.ops.gelu`
defaults to the approximation, so the names are mapped here explicitly. The
exact GELU is `backend_support.exact_gelu`, which computes it in the form
fastest on each backend.
"""

from keras import ops

from attention_zoo_keras import backend_support
from attention_zoo_keras.naming import NameRegistry

_ACTIVATIONS = NameRegistry("activation", "activations", {
    "gelu": backend_support.exact_gelu,
    "gelu_exact": backend_support.exact_gelu,
    "gelu_new": lambda x: ops.gelu(x, approximate=True),
    "gelu_tanh": lambda x: ops.gelu(x, approximate=True),
    "gelu_pytorch_tanh": lambda x: ops.gelu(x, approximate=True),
    "gelu_approximate": lambda x: ops.gelu(x, approximate=True),
    "relu": ops.relu,
    "silu": ops.silu,
    "swish": ops.silu,
    "tanh": ops.tanh,
})


def get_activation(name):
    """The activation function called `name` (see the module docstring).

    Args:
        name: str. A name from a checkpoint's config (`"gelu_new"`).

    Raises:
        ValueError: for an unknown name, with the close names and all known
            ones.
    """
    return _ACTIVATIONS.get(name)
