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

import inspect

import keras

from attention_zoo_keras.naming import NameRegistry
from attention_zoo_keras.naming import did_you_mean

PACKAGE = "attention_zoo_keras"

_REGISTERED_CLASSES = NameRegistry("registered class", "classes")


class UnregisteredClassError(ValueError):
    """A config names a class that this library did not register."""


class UnknownArgumentError(TypeError, ValueError):
    """A keyword argument, or a key of a config file, that the class it is
    meant for does not take (a `TypeError` as Python's own, and a
    `ValueError` as every other bad-config error here)."""


# Keyword arguments every model takes besides its own: Keras' `name` and
# `trainable`, and the `dtype` policy.
MODEL_ARGUMENTS = ("name", "trainable", "dtype")


def constructor_arguments(cls):
    """The keyword arguments `cls(...)` takes: its `__init__`'s named
    parameters and, while each `__init__` passes `**kwargs` on, those of its
    bases in this library, plus `MODEL_ARGUMENTS` for Keras models."""
    names = set()
    for klass in cls.__mro__:
        if klass.__module__.startswith("keras") or klass is object:
            break
        if "__init__" not in vars(klass):
            continue
        parameters = inspect.signature(vars(klass)["__init__"]).parameters.values()
        named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        names.update(p.name for p in parameters if p.kind in named and p.name != "self")
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
            return names
    if issubclass(cls, keras.Model):
        names.update(MODEL_ARGUMENTS)
    return names


def unknown_names(unknown, known):
    """`"'a', 'b'. 'a': Did you mean: c? 'b': no close name."`: the unknown
    names of a message, each with the closest known names."""
    hints = "".join(f" '{name}':{did_you_mean(name, sorted(known)) or ' no close name.'}" for name in unknown)
    return f"{', '.join(repr(name) for name in unknown)}.{hints}"


def check_arguments(cls, arguments, source, also_known=()):
    """Raises for any key of `arguments` that `cls(...)` does not take.

    Args:
        cls: type. The class the arguments are for.
        arguments: dict. The keyword arguments (or a config dict).
        source: str. Where they came from, for the message (`"config.json
            of 'my_preset'"`, `"BertBackbone.from_preset"`).
        also_known: collection of str. Other names valid where they were
            given (a `from_preset`'s own arguments), offered as suggestions
            too.

    Raises:
        UnknownArgumentError: naming each unknown key, with the closest
            accepted names.
    """
    known = constructor_arguments(cls) | set(also_known)
    unknown = sorted(str(key) for key in arguments if key not in known)
    if unknown:
        raise UnknownArgumentError(
            f"{source}: {cls.__name__} has no argument{'s' if len(unknown) > 1 else ''} "
            f"{unknown_names(unknown, known)} It takes: {', '.join(sorted(known))}."
        )


def register(cls):
    """Class decorator: allow `cls` to be named in config files."""
    name = cls.__name__
    if name not in _REGISTERED_CLASSES:
        _REGISTERED_CLASSES.add(name, cls)
    elif _REGISTERED_CLASSES.get(name) is not cls:
        raise ValueError(f"Two classes are registered as '{name}'.")
    keras.saving.register_keras_serializable(package=PACKAGE)(cls)
    return cls


def registered_names():
    """The sorted names of every registered class."""
    return _REGISTERED_CLASSES.names()


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
    return _REGISTERED_CLASSES.get(name)


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
        data: dict. Holds `class_name` and `config`.
        source: str. Where the data came from, named in errors.
        expected_base: type or None. If given, the class must be a subclass
            of it.
        **overrides: dict. Config entries to replace.
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
