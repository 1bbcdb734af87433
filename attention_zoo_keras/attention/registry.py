"""Attention mechanisms by name, so any block can take `attention="softmax"`.

A mechanism is a function

    mechanism(query, key, value, *, attention_mask=None, is_causal=False,
              dropout_rate=0.0, training=False, seed_generator=None) -> output

on tensors shaped `query: (batch, query_length, num_heads, head_dim)`,
`key` / `value: (batch, key_length, num_heads, head_dim)`, with a boolean
`attention_mask` broadcastable to `(batch, num_heads, query_length,
key_length)` where `True` means "may attend". It returns a tensor shaped like
`query`. Mechanisms are pure functions of `keras.ops`; layers own the weights.
"""

from attention_zoo_keras.naming import did_you_mean

_MECHANISMS = {}


def register_mechanism(name):
    """Decorator: make a mechanism function available under `name`."""

    def decorator(function):
        if name in _MECHANISMS:
            raise ValueError(f"An attention mechanism named '{name}' already exists.")
        _MECHANISMS[name] = function
        return function

    return decorator


def mechanism_names():
    """Names of every registered attention mechanism, sorted."""
    return sorted(_MECHANISMS)


def get_mechanism(name):
    """The mechanism function registered as `name`.

    Raises:
        ValueError: for an unknown name, listing the known ones.
    """
    if name not in _MECHANISMS:
        hint = did_you_mean(name, mechanism_names())
        raise ValueError(
            f"Unknown attention mechanism '{name}'.{hint} "
            f"Known mechanisms: {', '.join(mechanism_names())}."
        )
    return _MECHANISMS[name]
