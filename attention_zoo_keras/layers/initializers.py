"""Initializer helpers."""

import keras


def clone_initializer(initializer):
    """A fresh copy of `initializer`, so layers never share one instance.

    Keras warns (and with a fixed seed, repeats the same values) when a single
    initializer object initializes several variables.
    """
    initializer = keras.initializers.get(initializer)
    return initializer.__class__.from_config(initializer.get_config())
