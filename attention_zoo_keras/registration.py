"""The registry of classes a preset's config file may name.

Config files are data from the internet, so loading one must never be able
to instantiate an arbitrary class. Every serializable class of this library
is decorated with :func:`register`; :func:`deserialize` only builds classes
found here. Registered classes are also registered with Keras, so
`keras.saving.load_model` can rebuild them from a `.keras` archive.

Example:

>>> from attention_zoo_keras.registration import registered_names
>>> "BertBackbone" in registered_names()
True
"""


import keras

from attention_zoo_keras.naming import did_you_mean

PACKAGE = "attention_zoo_keras"

_REGISTERED_CLASSES = {}


class UnregisteredClassError(ValueError):
    """A config names a class that this library did not register."""


def register(cls):
    """Class decorator: allow `cls` to be named in config files."""
    name = cls.__name__
    if name in _REGISTERED_CLASSES and _REGISTERED_CLASSES[name] is not cls:
        raise ValueError(f"Two classes are registered as '{name}'.")
    _REGISTERED_CLASSES[name] = cls
    keras.saving.register_keras_serializable(package=PACKAGE)(cls)
    return cls


def registered_names():
    """The sorted names of every registered class."""
    return sorted(_REGISTERED_CLASSES)


def registered_class(name, source="config"):
    """Returns the registered class called `name`.

    Raises:
        UnregisteredClassError: naming the class, where the name came from,
            and the closest registered names.
    """
    if not isinstance(name, str):
        raise UnregisteredClassError(
            f"{source} names the class {name!r}, which attention_zoo_keras has not registered "
            "(it is not even a class name)."
        )
    if name.startswith(f"{PACKAGE}>"):
        name = name[len(PACKAGE) + 1 :]
    if name not in _REGISTERED_CLASSES:
        hint = did_you_mean(name, registered_names())
        raise UnregisteredClassError(
            f"{source} names the class '{name}', which attention_zoo_keras "
            f"has not registered, so it will not be built.{hint}"
        )
    return _REGISTERED_CLASSES[name]


def serialize(obj):
    """Returns `{"class_name", "registered_name", "config"}` for `obj`."""
    registered_class(type(obj).__name__, source=f"serialize({type(obj).__name__})")
    return {
        "class_name": type(obj).__name__,
        "registered_name": f"{PACKAGE}>{type(obj).__name__}",
        "config": obj.get_config(),
    }


def deserialize(data, source="config", expected_base=None, **overrides):
    """Builds an object from `serialize`'s output, registered classes only.

    Args:
        data: a dict with `class_name` and `config`.
        source: where the data came from, named in errors.
        expected_base: if given, the class must be a subclass of it.
        **overrides: config entries to replace.
    """
    if not isinstance(data, dict) or "class_name" not in data:
        raise ValueError(f"{source} is not a serialized attention_zoo_keras object.")
    cls = registered_class(data["class_name"], source=source)
    if expected_base is not None and not issubclass(cls, expected_base):
        raise TypeError(
            f"{source} holds a {cls.__name__}, which is not a "
            f"{expected_base.__name__}."
        )
    config = dict(data.get("config", {}))
    config.update(overrides)
    return cls.from_config(config)
