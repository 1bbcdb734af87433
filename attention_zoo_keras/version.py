"""The library's version, written into every preset it saves."""

__version__ = "0.1.0"
