"""Conversion of upstream checkpoints into native presets: the `azk-convert`
command line (`python -m attention_zoo_keras.conversion`; from a checkout,
also `python -m conversion`).

It is the top layer of the package: it uses the models and the hub code,
and nothing in the library imports it. PyTorch and `transformers` are
optional: only the commands that read a `.bin` or run the reference need
them, and they say which extra to install (`optional_module`).

Modules:
    cli: the commands (`list`, `convert`, `verify`, `publish`, `vilbert`).
    state_dict: reading a checkpoint's tensors (safetensors, or a `.bin`
        strictly with `torch.load(weights_only=True)`).
    verifiers: the numerical comparison with `transformers`, per family.
    vilbert: the ViLBERT authors' checkpoints to one native preset.
"""

import importlib

# The extras of this distribution that install an optional module.
_EXTRAS = {"torch": "torch", "transformers": "conversion"}


def optional_module(name, purpose):
    """Imports the optional dependency `name` (`"torch"` or
    `"transformers"`), or raises an `ImportError` that says what needs it
    and which extra installs it.

    Args:
        name: the module to import.
        purpose: what needs it, in words (`"reading 'model.bin'"`).

    Returns:
        The module.

    Raises:
        ImportError: the module is not installed.

    Example:

    >>> optional_module("numpy", "this example").__name__
    'numpy'
    """
    try:
        return importlib.import_module(name)
    except ImportError as error:
        extra = _EXTRAS.get(name, name)
        raise ImportError(
            f"{purpose} needs {name}, which is not installed: pip install 'attention_zoo_keras[{extra}]'."
        ) from error
