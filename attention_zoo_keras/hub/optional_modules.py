"""Optional dependencies (`torch`, `transformers`), imported on demand with
an error that names the extra which installs them."""

import importlib

# The extras of this distribution that install an optional module.
_EXTRAS = {"torch": "torch", "transformers": "conversion"}


def optional_module(name, purpose):
    """Imports the optional dependency `name` (`"torch"` or
    `"transformers"`), or raises an `ImportError` that says what needs it
    and which extra installs it.

    Args:
        name: str. The module to import.
        purpose: str. What needs it, in words (`"reading 'model.bin'"`).

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
