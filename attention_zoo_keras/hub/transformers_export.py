"""Export to the `transformers` layout: a family's converter, run backwards.

A converter maps a `transformers` checkpoint to this library's variables
(`TransformersConverter.weights`) by renaming, transposing, splitting and
reshaping tensors: every one of our weights is a rearrangement of the
checkpoint's elements. Running the converter once on a *probe* checkpoint,
whose elements are their own positions (`1, 2, 3, ...` across all tensors,
in the shapes `transformers` gives them), shows for each of our elements the
position it came from; writing our values to those positions inverts the
converter exactly, without a second, hand-written mapping that could drift
from the first. Position `0` marks an element the converter makes up (a zero
bias where `transformers` has none): ours must be zero there.

The shapes come from `transformers` itself (the architecture built on
PyTorch's `meta` device, which allocates nothing), so exporting needs
`torch` and `transformers`; reading the result needs only `transformers`.

Example:

>>> classifier = azk.models.BertTextClassifier.from_preset("minilm_l6", num_classes=2)  # doctest: +SKIP
>>> classifier.export_to_transformers("./exported")                                     # doctest: +SKIP
>>> transformers.AutoModelForSequenceClassification.from_pretrained("./exported")       # doctest: +SKIP
"""

import inspect
import json
import math

import keras
import numpy as np

from attention_zoo_keras.hub.atomic import atomic_directory
from attention_zoo_keras.hub.converters import NotExportableError
from attention_zoo_keras.hub.converters import converter_for_backbone
from attention_zoo_keras.hub.converters import matches_any
from attention_zoo_keras.hub.optional_modules import optional_module
from attention_zoo_keras.hub.preset_format import CONFIG_FILE
from attention_zoo_keras.hub.preset_format import TOKENIZER_FILE
from attention_zoo_keras.hub.preset_format import VOCABULARY_FILE
from attention_zoo_keras.hub.safetensors_file import write_safetensors
from attention_zoo_keras.hub.weights import WEIGHTS_FILE
from attention_zoo_keras.hub.weights import variables_by_key
from attention_zoo_keras.user_warnings import warn

TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
# Every file an export may write (a family's `export_preprocessor` included).
EXPORTED_FILES = frozenset({
    CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_CONFIG_FILE, TOKENIZER_FILE, "preprocessor_config.json",
    "source.spm", "target.spm", VOCABULARY_FILE,
})
# Configuration entries that say how a model is built or run, not what it
# computes (so do initializers: keys ending in `initializer` or
# `initializer_range`). `recompute`: the Reformer's memory-saving backward pass.
NOT_ARCHITECTURE = frozenset({"name", "trainable", "dtype", "lora", "seed", "recompute"})


def transformers_shapes(hf_config):
    """`{tensor name: shape}` of the `transformers` architecture
    `hf_config["architectures"][0]` built from `hf_config`, on the `meta`
    device (no memory is allocated), under the names its checkpoints use."""
    transformers = optional_module("transformers", "Exporting to the transformers format")
    torch = optional_module("torch", "Exporting to the transformers format")
    settings = {k: v for k, v in hf_config.items() if k not in ("model_type", "architectures")}
    config = transformers.AutoConfig.for_model(hf_config["model_type"], **settings)
    architecture = getattr(transformers, hf_config["architectures"][0])
    with torch.device("meta"):
        reference = architecture(config)
    state = reference.state_dict()
    try:  # transformers 5 renames modules and maps checkpoints' names on loading
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:
        pass
    else:  # as its `save_pretrained`, write the names the Hub's checkpoints use
        state = revert_weight_conversion(reference, state)
    return {name: tuple(tensor.shape) for name, tensor in state.items()}


def probe_checkpoint(shapes):
    """`{name: array of shape}` whose elements number every element of every
    tensor, from 1 on (int32 while the count allows, else int64)."""
    total = sum(math.prod(shape) for shape in shapes.values())
    dtype = np.int32 if total < np.iinfo(np.int32).max else np.int64
    checkpoint, start = {}, 1
    for name, shape in shapes.items():
        size = math.prod(shape)
        checkpoint[name] = np.arange(start, start + size, dtype=dtype).reshape(shape)
        start += size
    return checkpoint


def _probe_positions(converter, hf_config, checkpoint):
    """`{our key: integer array of checkpoint positions}` from running the
    converter on the probe `checkpoint`; raises where a converter computes
    (scales, adds) rather than rearranges."""
    positions = {}
    for key, array in converter.weights(hf_config, checkpoint).items():
        array = np.asarray(array)
        if not np.issubdtype(array.dtype, np.integer):
            raise NotExportableError(
                f"The {converter.model_type} converter computes '{key}' from the checkpoint "
                "instead of rearranging it, so it cannot be run backwards."
            )
        positions[key] = array
    return positions


def transformers_arrays(converter, hf_config, checkpoint, arrays, description):
    """`{tensor name: array}` in the `transformers` layout of the converter's
    family, from our `{variable key: array}`.

    Args:
        converter: TransformersConverter. The family's converter.
        hf_config: dict. The `transformers` config (as `config.json`).
        checkpoint: dict of str to numpy array. The probe checkpoint
            (`probe_checkpoint`) of the `transformers` tensors' shapes.
        arrays: dict of str to numpy array. Our weights by variable key.
        description: str. The model, for messages.

    Returns:
        dict of str to numpy array: every tensor whose elements all come
        from `arrays`. Tensors none of whose elements do are left out:
        tied weights and buffers, which `transformers` rebuilds, and parts
        this model lacks (a pooler), which it initializes, with a warning.

    Weights the family may lack (the converter's `optional_keys`, such as
    BERT's pooler) are left out, with a warning, where the architecture has
    no place for them.

    Raises:
        NotExportableError: a weight of ours has no place in the layout, or
            its shape differs from the place's, or two weights of ours
            land on the same elements with different values, or a tensor
            would be only partly written.
    """
    positions = _probe_positions(converter, hf_config, checkpoint)
    homeless = sorted(set(arrays) - set(positions))
    dropped = [key for key in homeless if key in converter.optional_keys]
    if dropped:
        warn(
            f"transformers' {hf_config['architectures'][0]} has no {', '.join(dropped)} (which "
            f"{description}'s outputs do not use); the export leaves them out."
        )
        arrays = {key: value for key, value in arrays.items() if key not in dropped}
        homeless = [key for key in homeless if key not in dropped]
    if homeless:
        raise NotExportableError(
            f"{description} has weights with no place in transformers' {hf_config['architectures'][0]}: "
            f"{', '.join(homeless)}."
        )
    size = 1 + sum(tensor.size for tensor in checkpoint.values())
    dtypes = {np.asarray(array).dtype for array in arrays.values()}
    flat = np.zeros(size, dtype=np.result_type(*dtypes))
    written = np.zeros(size, dtype=bool)
    for key, array in arrays.items():
        where, value = positions[key], np.asarray(array)
        if where.shape != value.shape:
            raise NotExportableError(
                f"'{key}' of {description} has the shape {value.shape}; its place in transformers' "
                f"layout has the shape {where.shape}."
            )
        made_up = where == 0
        if np.any(value[made_up] != 0):
            raise NotExportableError(
                f"'{key}' of {description} is not zero where transformers' layout has no weight "
                "(e.g. a bias the transformers model does not have)."
            )
        where, value = where[~made_up], value[~made_up]
        taken = written[where]
        if np.any(flat[where[taken]] != value[taken]):
            raise NotExportableError(
                f"'{key}' of {description} and another weight are one tensor in transformers' layout "
                "(tied there) but differ here."
            )
        flat[where] = value
        written[where] = True
    exported, initialized = {}, []
    for name, tensor_positions in checkpoint.items():
        covered = written[tensor_positions]
        if covered.all():
            exported[name] = flat[tensor_positions]
        elif covered.any():
            raise NotExportableError(
                f"Only part of transformers' '{name}' comes from {description}'s weights."
            )
        elif not matches_any(name, converter.ignored_source_keys):
            initialized.append(name)
    if initialized:
        warn(
            f"{description} has nothing for these tensors of transformers' "
            f"{hf_config['architectures'][0]}, which transformers will initialize when it loads "
            f"the export: {', '.join(initialized)}."
        )
    return exported


def _same(value, implied):
    """Whether a config value equals what the `transformers` config implies
    (lists and tuples alike, and an empty container the same as `None`)."""
    def plain(v):
        return None if v in ({}, [], ()) else json.loads(json.dumps(v))
    return plain(value) == plain(implied)


def check_expressible(converter, backbone, hf_config, checkpoint):
    """Raises unless converting `hf_config` back gives `backbone`'s own
    configuration, so that the exported model computes what `backbone` does.

    Every architecture argument of the backbone must equal the one the
    converter derives from `hf_config` or, where the converter derives none,
    the constructor's default (which is then what a conversion would build).
    Arguments the converter reads from the weights (`checkpoint_sizes`,
    `checkpoint_arguments` of the probe `checkpoint`) are left to the
    weights' mapping, which checks every shape.
    """
    implied = converter.backbone_config(hf_config)
    from_weights = {*converter.checkpoint_sizes, *converter.checkpoint_arguments(hf_config, checkpoint, {})}
    signature = inspect.signature(type(backbone).__init__).parameters
    problems = []
    for key, value in backbone.get_config().items():
        if key in NOT_ARCHITECTURE or key in from_weights or key.endswith(("initializer", "initializer_range")):
            continue
        if key in implied:
            expected = implied[key]
        elif key in signature and signature[key].default is not inspect.Parameter.empty:
            expected = signature[key].default
        else:
            continue
        if not _same(value, expected):
            problems.append(f"{key}={value!r} (transformers' {hf_config['model_type']} gives {expected!r})")
    if problems:
        raise NotExportableError(
            f"{type(backbone).__name__} cannot be exported to transformers: its "
            + "; ".join(problems) + "."
        )


def write_tokenizer_config(directory, tokenizer_class, **settings):
    """Writes the `tokenizer_config.json` that names `transformers`'
    tokenizer class and its `settings` (special tokens, maximum length)
    beside the tokenizer's own files.

    Args:
        directory: pathlib.Path. Where to write.
        tokenizer_class: str. The `transformers` class, e.g. `"BertTokenizer"`.
        **settings: that class's arguments.
    """
    config = {"tokenizer_class": tokenizer_class, **settings}
    (directory / TOKENIZER_CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _exported_entries(directory):
    """The files of an earlier export in `directory` (which a new export
    replaces; a user's other files are kept), or `None` where `directory`
    holds something that is not a `transformers` export."""
    config = directory / CONFIG_FILE
    if not config.is_file():
        return None if any(directory.iterdir()) else set()
    try:
        is_transformers = "model_type" in json.loads(config.read_text())
    except (OSError, ValueError):
        return None
    if not is_transformers:
        return None
    return {entry.name for entry in directory.iterdir() if entry.name in EXPORTED_FILES}


def export_to_transformers(model, directory, preprocessor=None):
    """Writes `model` to `directory` in the `transformers` layout of its
    family: `config.json`, `model.safetensors` and, with `preprocessor`,
    the files `AutoTokenizer` (or `AutoImageProcessor`) reads. Atomic: on
    any error `directory` keeps what it held.

    Args:
        model: Backbone or Task. The model; its backbone's family must have
            a `transformers` converter that can run backwards.
        directory: str or path. Created or replaced (an earlier export's
            files only; files a user added are kept).
        preprocessor: Preprocessor or None. Its tokenizer (image
            settings) written beside the model.

    Raises:
        NotExportableError: the model computes something the layout cannot
            hold (the message names the setting or weight).
        ImportError: `torch` or `transformers` is missing.
    """
    backbone = getattr(model, "backbone", model)
    converter = converter_for_backbone(type(backbone))
    if converter is None:
        raise NotExportableError(f"{type(backbone).__name__} has no transformers counterpart to export to.")
    description = type(model).__name__
    hf_config = {
        "model_type": converter.model_type,
        "architectures": [converter.transformers_architecture(model)],
        **converter.transformers_config(model),
    }
    checkpoint = probe_checkpoint(converter.transformers_shapes(hf_config) or transformers_shapes(hf_config))
    check_expressible(converter, backbone, hf_config, checkpoint)
    arrays = transformers_arrays(
        converter, hf_config, checkpoint,
        {key: keras.ops.convert_to_numpy(value) for key, value in variables_by_key(model).items()},
        description,
    )
    hf_config["dtype"] = str(next(iter(arrays.values())).dtype)
    exports = "an earlier transformers export"
    with atomic_directory(directory, owned_entries=_exported_entries, kind=exports) as staging:
        (staging / CONFIG_FILE).write_text(json.dumps(hf_config, indent=2, sort_keys=True) + "\n")
        write_safetensors(staging / WEIGHTS_FILE, arrays, metadata={"format": "pt"})
        if preprocessor is not None:
            converter.export_preprocessor(preprocessor, staging)
