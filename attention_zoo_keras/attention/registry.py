"""Attention mechanisms by name, so any block can take `attention="softmax"`,
and what each mechanism keeps between decoding steps.

A mechanism is a function

    mechanism(query, key, value, *, attention_mask=None, is_causal=False,
              dropout_rate=0.0, training=False, seed_generator=None,
              **options_and_weights) -> output

on tensors shaped `query: (batch, query_length, num_heads, head_dim)`,
`key` / `value: (batch, key_length, num_heads, head_dim)`, with a boolean
`attention_mask` broadcastable to `(batch, num_heads, query_length,
key_length)` where `True` means "may attend". It returns a tensor shaped like
`query`. Mechanisms are pure functions of `keras.ops`; layers own the weights.

**Options and weights.** A mechanism's further keyword arguments are its
options (`block_size=` of local attention, `feature_map=` of linear
attention, …) and, for mechanisms with learned parameters, its weights. A
mechanism with weights registers a *weights function* with it,

    weights(num_heads, head_dim, **weight_options) -> {argument: (shape, initializer)}

and a layer creates one variable per entry and passes it under that name
(`relative_attention_weights`, `additive_attention_weights`).
`mechanism_options(name)` lists what a user may set (the options of both
functions, with their defaults); `MultiHeadAttention(attention_options=...)`
checks against it.

A mechanism that supports incremental (token-by-token) decoding also
registers a `DecodingCache` under its name (`register_decoding`): the
object that says what its cache is — a key/value cache for softmax
(`decoding.KeyValueCache`), the recurrent state `(S, z)` for linear
attention (`linear_decoding.RecurrentState`) — and how new positions
attend with it. Layers decode through `get_decoding(name)` and never
branch on the mechanism. Each name holds one `RegisteredMechanism` record.
"""

import dataclasses
import inspect
from typing import Callable
from typing import Optional

from attention_zoo_keras.attention.decoding import DecodingCache
from attention_zoo_keras.naming import NameRegistry
from attention_zoo_keras.naming import did_you_mean


@dataclasses.dataclass
class RegisteredMechanism:
    """What the registry knows of one mechanism (see `register_mechanism`).

    Args:
        function: callable. The mechanism itself.
        weights: callable or None. Its weights function, if it has weights.
        inputs: tuple of str. Arguments the caller computes for every call.
        value_arguments: tuple of str. Weights that act on the values alone.
        hash_rounds: bool. Whether it combines hashing rounds.
        decoding: DecodingCache or None. Its incremental decoding, once
            registered (`register_decoding`).
    """

    function: Callable
    weights: Optional[Callable] = None
    inputs: tuple = ()
    value_arguments: tuple = ()
    hash_rounds: bool = False
    decoding: Optional[DecodingCache] = None


_MECHANISMS = NameRegistry("attention mechanism", "mechanisms")

# Arguments every mechanism takes, set by the calling layer.
CALL_ARGUMENTS = (
    "query", "key", "value", "attention_mask", "is_causal", "dropout_rate", "training", "seed_generator",
)
# Arguments a layer sets while decoding (the absolute position of the first
# query), never options.
DECODING_ARGUMENTS = ("query_offset",)
# Arguments `attention_probabilities` sets to look inside a mechanism, never options.
INSPECTION_ARGUMENTS = ("separate_rounds",)
# An argument a mechanism may take in place of `attention_mask`: each row's
# number of keys (right-padded rows), which fused kernels take without a mask.
KEY_LENGTHS_ARGUMENT = "key_lengths"
# Arguments of a weights function that the layer supplies.
WEIGHTS_FUNCTION_ARGUMENTS = ("num_heads", "head_dim")


def register_mechanism(name, weights=None, inputs=(), value_arguments=(), hash_rounds=False):
    """Decorator: make a mechanism function available under `name`.

    Args:
        name: str. The name blocks take (`attention=name`).
        weights: callable or None. For a mechanism with learned parameters,
            the function `(num_heads, head_dim, **weight_options) ->
            {argument: (shape, initializer)}` naming the weight arguments it
            takes; every weight option has a default.
        inputs: tuple of str. Names of arguments the caller computes for
            every call (Transformer-XL's projected distance encodings),
            neither options nor weights; `MultiHeadAttention` takes them as
            `mechanism_arguments`.
        value_arguments: tuple of str. Names of weights that act on the
            values alone (relative attention's w^V): the attention
            probabilities do not depend on them, and
            `attention_probabilities` leaves them out.
        hash_rounds: bool. Whether the mechanism combines hashing rounds
            (LSH) and takes `separate_rounds=True` to return each round's
            output side by side, `(B, T, N, rounds·M)`.
    """

    def decorator(function):
        record = RegisteredMechanism(
            function, weights=weights, inputs=tuple(inputs), value_arguments=tuple(value_arguments),
            hash_rounds=bool(hash_rounds),
        )
        _MECHANISMS.add(name, record)
        return function

    return decorator


def mechanism_names():
    """Names of every registered attention mechanism, sorted."""
    return _MECHANISMS.names()


def get_mechanism(name):
    """The mechanism function registered as `name`.

    Raises:
        ValueError: for an unknown name, listing the known ones.
    """
    return _MECHANISMS.get(name).function


def mechanism_inputs(name):
    """The per-call inputs mechanism `name` needs besides the query, key and
    value (see `register_mechanism`), a tuple of argument names."""
    return _MECHANISMS.get(name).inputs


def mechanism_value_arguments(name):
    """The arguments of mechanism `name` that act on the values alone (see
    `register_mechanism`), a tuple of argument names."""
    return _MECHANISMS.get(name).value_arguments


def mechanism_hashes_in_rounds(name):
    """Whether mechanism `name` combines hashing rounds and can return them
    separately (see `register_mechanism`)."""
    return _MECHANISMS.get(name).hash_rounds


def _keyword_defaults(function, excluded):
    return {
        parameter.name: parameter.default
        for parameter in inspect.signature(function).parameters.values()
        if parameter.name not in excluded and parameter.kind is not inspect.Parameter.VAR_KEYWORD
    }


def mechanism_options(name):
    """The options of mechanism `name` a user may set, `{option: default}`
    : the keyword arguments of
    the mechanism and of its weights function, less the call arguments and
    the weights themselves. Where both take an option, the weights
    function's default wins (it decides the weights' shapes).

    Example:

    >>> sorted(mechanism_options("local"))
    ['block_size', 'cyclic', 'num_memory_blocks', 'num_memory_blocks_after', 'scale']
    """
    mechanism = _MECHANISMS.get(name)
    weights = mechanism.weights
    excluded = set(
        CALL_ARGUMENTS + DECODING_ARGUMENTS + INSPECTION_ARGUMENTS + WEIGHTS_FUNCTION_ARGUMENTS + mechanism.inputs
    ) | {KEY_LENGTHS_ARGUMENT}
    if weights is not None:
        excluded |= set(weights(num_heads=1, head_dim=1))  # the weight arguments' names
    options = _keyword_defaults(mechanism.function, excluded)
    if weights is not None:
        options.update(_keyword_defaults(weights, excluded))
    return options


def takes_key_lengths(name):
    """Whether mechanism `name` takes `key_lengths=` in place of a mask
    (`attention.softmax_attention` does).

    >>> takes_key_lengths("softmax"), takes_key_lengths("local")
    (True, False)
    """
    return KEY_LENGTHS_ARGUMENT in inspect.signature(get_mechanism(name)).parameters


def check_options(name, options):
    """Raises `ValueError` naming any key of `options` that mechanism `name`
    does not take (with close names and the full list)."""
    known = mechanism_options(name)
    for option in options:
        if option not in known:
            hint = did_you_mean(option, sorted(known))
            listing = ", ".join(sorted(known)) or "none"
            raise ValueError(
                f"The attention mechanism '{name}' has no option '{option}'.{hint} Its options: {listing}."
            )


def mechanism_weights(name, num_heads, head_dim, options):
    """`{argument: (shape, initializer)}`, the weights mechanism `name` takes
    for heads of `head_dim` under `options` (empty for a mechanism without
    weights)."""
    weights = _MECHANISMS.get(name).weights
    if weights is None:
        return {}
    accepted = _keyword_defaults(weights, set(WEIGHTS_FUNCTION_ARGUMENTS))
    return weights(num_heads, head_dim, **{k: v for k, v in options.items() if k in accepted})


def call_options(name, options):
    """The entries of `options` that the mechanism function itself takes
    (the rest configure its weights)."""
    accepted = _keyword_defaults(get_mechanism(name), set(CALL_ARGUMENTS))
    return {option: value for option, value in options.items() if option in accepted}


def register_decoding(name, decoding):
    """Record `decoding`, a `DecodingCache`, as the incremental decoding of
    the mechanism registered as `name`.

    Raises:
        ValueError: if `name` is not a registered mechanism or already has one.
        TypeError: if `decoding` is not a `DecodingCache`.
    """
    mechanism = _MECHANISMS.get(name)
    if not isinstance(decoding, DecodingCache):
        raise TypeError(f"decoding must be a DecodingCache; got {type(decoding).__name__}.")
    if mechanism.decoding is not None:
        raise ValueError(f"The attention mechanism '{name}' already has a decoding cache.")
    mechanism.decoding = decoding


def get_decoding(name):
    """The `DecodingCache` of the mechanism registered as `name`.

    Raises:
        ValueError: for an unknown name, or a mechanism without incremental
            decoding (listing those that have one).
    """
    decoding = _MECHANISMS.get(name).decoding
    if decoding is None:
        decodable = [known for known in _MECHANISMS.names() if _MECHANISMS.get(known).decoding is not None]
        raise ValueError(
            f"The attention mechanism '{name}' has no incremental decoding (no decoding cache "
            f"registered), so it cannot generate token by token. Mechanisms that have one: "
            f"{', '.join(decodable)}."
        )
    return decoding
