"""The Reformer's attention settings in the vocabulary every backbone uses:
`attention`, the mechanism of each layer (`"lsh"`, `"local"` or any other
registered name), `attention_options`, each mechanism's options under the
names the mechanism itself takes (`attention.lsh_attention`,
`attention.local_attention`), over the Reformer's defaults (those of
transformers' `ReformerConfig`), and `attention_dropout`, the dropout on
the attention probabilities, per mechanism.

Configs saved before this vocabulary had flat keys, translated as

    attention_layers           → attention
    num_hashes, num_buckets    → attention_options["lsh"]["num_hashes"], ["num_buckets"]
    lsh_chunk_length           → attention_options["lsh"]["chunk_length"]
    lsh_num_chunks_before      → attention_options["lsh"]["num_chunks_before"]
    lsh_num_chunks_after       → attention_options["lsh"]["num_chunks_after"]
    hash_seed                  → attention_options["lsh"]["seed"]
    local_chunk_length         → attention_options["local"]["block_size"]
    local_num_chunks_before    → attention_options["local"]["num_memory_blocks"]
    local_num_chunks_after     → attention_options["local"]["num_memory_blocks_after"]
    lsh_attention_dropout      → attention_dropout["lsh"]
    local_attention_dropout    → attention_dropout["local"]
"""

from attention_zoo_keras.attention.registry import check_options
from attention_zoo_keras.attention.registry import get_mechanism

DEFAULT_ATTENTION = ("local", "lsh", "local", "lsh", "local", "lsh")
DEFAULT_ATTENTION_OPTIONS = {
    "lsh": {
        "num_hashes": 1,
        "num_buckets": None,
        "chunk_length": 64,
        "num_chunks_before": 1,
        "num_chunks_after": 0,
        "seed": None,
    },
    "local": {"block_size": 64, "num_memory_blocks": 1, "num_memory_blocks_after": 0},
}
DEFAULT_ATTENTION_DROPOUT = {"lsh": 0.0, "local": 0.05}
# The option of each chunked mechanism that sets its chunk length, and the
# one that lets a chunk see later chunks (none in a causal stack).
CHUNK_LENGTH_OPTION = {"lsh": "chunk_length", "local": "block_size"}
LATER_CHUNKS_OPTION = {"lsh": "num_chunks_after", "local": "num_memory_blocks_after"}

LEGACY_OPTIONS = {
    "num_hashes": ("lsh", "num_hashes"),
    "num_buckets": ("lsh", "num_buckets"),
    "lsh_chunk_length": ("lsh", "chunk_length"),
    "lsh_num_chunks_before": ("lsh", "num_chunks_before"),
    "lsh_num_chunks_after": ("lsh", "num_chunks_after"),
    "hash_seed": ("lsh", "seed"),
    "local_chunk_length": ("local", "block_size"),
    "local_num_chunks_before": ("local", "num_memory_blocks"),
    "local_num_chunks_after": ("local", "num_memory_blocks_after"),
}
LEGACY_ATTENTION_DROPOUTS = {"lsh_attention_dropout": "lsh", "local_attention_dropout": "local"}


def layer_attention(attention, num_layers=None):
    """The mechanism of each layer, checked against the registry.

    Args:
        attention: str or sequence of str. One mechanism name for every
            layer, or one name per layer.
        num_layers: int or None. The number of layers: needed with a single
            name; with a sequence it must equal its length.

    Returns:
        A list of mechanism names, one per layer.

    Raises:
        ValueError: for an unknown mechanism, no layer, or a `num_layers`
            that disagrees with `attention`.
    """
    if isinstance(attention, str):
        if num_layers is None:
            raise ValueError(f"attention={attention!r} names one mechanism for every layer; give num_layers too.")
        layers = [attention] * int(num_layers)
    else:
        layers = [str(name) for name in attention]
        if num_layers is not None and num_layers != len(layers):
            raise ValueError(f"attention names {len(layers)} layers' mechanisms {layers}; got num_layers={num_layers}.")
    if not layers:
        raise ValueError("The Reformer needs at least one layer; attention names none.")
    for name in set(layers):
        get_mechanism(name)  # an unknown name raises, listing the mechanisms
    return layers


def attention_options_with_defaults(attention_options):
    """Each mechanism's options: those given over the Reformer's defaults
    (`DEFAULT_ATTENTION_OPTIONS`, for `"lsh"` and `"local"`).

    Args:
        attention_options: dict or None. `{mechanism: {option: value}}`,
            the options named as the mechanism takes them.

    Returns:
        A dict `{mechanism: {option: value}}`.

    Raises:
        ValueError: for an unknown mechanism or option, or a mechanism's
            options that are not a dict.
    """
    given = dict(attention_options or {})
    for name, options in given.items():
        if not isinstance(options, dict):
            raise ValueError(
                "The Reformer's attention_options maps each mechanism to a dict of its options, e.g. "
                f"{{'lsh': {{'chunk_length': 64}}, 'local': {{'block_size': 64}}}}; got {name!r}: {options!r}."
            )
        get_mechanism(name)
        check_options(name, options)
    return {name: {**DEFAULT_ATTENTION_OPTIONS.get(name, {}), **given.get(name, {})} for name in
            {**DEFAULT_ATTENTION_OPTIONS, **given}}


def attention_dropout_with_defaults(attention_dropout, layers):
    """The dropout on the attention probabilities of each mechanism: one
    rate for every layer, or `{mechanism: rate}` over
    `DEFAULT_ATTENTION_DROPOUT` (0 for mechanisms named in neither).

    Args:
        attention_dropout: float, dict or None. A rate, or rates by
            mechanism; `None` for the defaults.
        layers: list of str. Each layer's mechanism.

    Returns:
        A dict `{mechanism: rate}` for every mechanism of `layers` and of
        the defaults (one form, whichever was given, so that equal
        settings compare equal).

    Raises:
        ValueError: for an unknown mechanism name.
    """
    if attention_dropout is None:
        attention_dropout = {}
    if not isinstance(attention_dropout, dict):
        return {name: float(attention_dropout) for name in {*DEFAULT_ATTENTION_DROPOUT, *layers}}
    for name in attention_dropout:
        get_mechanism(name)
    return {**{name: 0.0 for name in layers}, **DEFAULT_ATTENTION_DROPOUT, **attention_dropout}


def layer_attention_dropout(attention_dropout, name):
    """The attention dropout rate of a layer of mechanism `name`, from
    `attention_dropout_with_defaults`' result `attention_dropout`."""
    return attention_dropout[name]


def layer_options(name, options, is_causal):
    """The options a layer of mechanism `name` runs with, from the
    mechanisms' options `options`: local attention's windows wrap around
    in a bidirectional stack (transformers' `_look_adjacent`), unless
    `cyclic` is given."""
    if name == "local":
        return {"cyclic": not is_causal, **options["local"]}
    return options.get(name)


def chunk_lengths(layers, options):
    """The sorted, distinct chunk lengths of the chunked layers (LSH and
    local) among `layers`, under the mechanisms' options `options`."""
    return sorted({options[name][CHUNK_LENGTH_OPTION[name]] for name in layers if name in CHUNK_LENGTH_OPTION})


def check_causal_windows(layers, options, is_causal):
    """Raises `ValueError` where a causal stack's chunked layers would see
    later chunks."""
    if not is_causal:
        return
    for name in sorted(set(layers) & set(LATER_CHUNKS_OPTION)):
        later = options[name][LATER_CHUNKS_OPTION[name]]
        if later:
            raise ValueError(
                f"A causal Reformer attends to no later chunks: attention_options['{name}']"
                f"['{LATER_CHUNKS_OPTION[name]}'] must be 0; got {later}."
            )


def translate_legacy_config(config):
    """A `ReformerBackbone` config saved before `attention` /
    `attention_options`, in today's keys (the table in the module
    docstring); other configs come back unchanged. Where a config holds
    both forms, the new one's values win.

    Args:
        config: dict. A saved `ReformerBackbone.get_config()`.

    Returns:
        A new dict.
    """
    config = dict(config)
    if "attention_layers" in config:
        config["attention"] = config.pop("attention_layers")
    options = {}
    for old, (name, option) in LEGACY_OPTIONS.items():
        if old in config:
            options.setdefault(name, {})[option] = config.pop(old)
    if options:
        given = config.get("attention_options") or {}
        config["attention_options"] = {name: {**options.get(name, {}), **given.get(name, {})} for name in
                                       {**options, **given}}
    dropouts = {name: config.pop(old) for old, name in LEGACY_ATTENTION_DROPOUTS.items() if old in config}
    if dropouts and config.get("attention_dropout") is None:
        config["attention_dropout"] = dropouts
    return config
