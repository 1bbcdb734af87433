"""Reading a checkpoint's tensors for conversion: safetensors if the
checkpoint has them, else its PyTorch `pytorch_model.bin`, strictly with
`torch.load(weights_only=True)`, which refuses to unpickle anything but
tensors and plain containers. (Loading at run time never reads `.bin`.)

A refused `.bin` is reported in the library's own words: torch's message
suggests re-running with `weights_only=False` or allow-listing the class,
which would run code from an untrusted file, so it is never shown."""

import pickle
import re

from attention_zoo_keras.hub.optional_modules import optional_module
from attention_zoo_keras.hub.converters import converter_for
from attention_zoo_keras.hub.preset_format import is_native
from attention_zoo_keras.hub.source import PresetFileError
from attention_zoo_keras.hub.source import PresetSource
from attention_zoo_keras.hub.transformers_preset_loader import TransformersPresetLoader
from attention_zoo_keras.hub.weights import Checkpoint

# What torch's weights-only unpickler names when it refuses a pickled object.
_REFUSED_GLOBAL = re.compile(r"Unsupported global: GLOBAL ([\w.]+)")


def _refusal(path, error):
    """A `PresetFileError` for a `.bin` that `torch.load(weights_only=True)`
    refused: what it holds (the refused object's name, when torch gives it),
    never torch's advice to unpickle it anyway."""
    found = _REFUSED_GLOBAL.search(str(error))
    what = f"the Python object `{found.group(1)}`" if found else "data that is not tensors"
    return PresetFileError(
        f"'{path}' holds {what}, so it was not loaded: PyTorch checkpoints are read with "
        "torch.load(weights_only=True), which unpickles only tensors and plain containers, because "
        "unpickling anything else can run code from the file. Convert a .safetensors copy of the "
        "checkpoint instead."
    )


def load_torch_file(path):
    """`{name: numpy array}` of a PyTorch `state_dict` file (`.bin`, `.pt`),
    read with `torch.load(map_location="cpu", weights_only=True)`; floating
    tensors as float32. A `{"state_dict": {...}}` wrapper is unwrapped. A
    tensor tied to an earlier one (the same memory: a language model's
    output bias or decoder tied to its embeddings) is read once, under the
    earlier name, as in the checkpoint's safetensors form.

    Raises:
        PresetFileError: the file holds anything but a dict of tensors, or
            is no readable PyTorch file.
        ImportError: PyTorch is not installed.
    """
    torch = optional_module("torch", f"Reading the PyTorch checkpoint '{path}'")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        # `from None`: torch's message, with its advice, must not reach a traceback either.
        raise _refusal(path, error) from None
    except (EOFError, RuntimeError, LookupError, ValueError, TypeError, AttributeError) as error:
        # A truncated or foreign file: torch fails inside its reader.
        raise PresetFileError(
            f"'{path}' is not a PyTorch checkpoint that can be read ({type(error).__name__} in torch.load): it is "
            "truncated or not a file written by torch.save."
        ) from error
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict) or not all(isinstance(value, torch.Tensor) for value in state.values()):
        raise PresetFileError(f"'{path}' does not hold a state_dict (a dict of tensors).")
    arrays, seen = {}, set()
    for name, tensor in state.items():
        view = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape), tensor.stride())
        if tensor.numel() and view in seen:
            continue  # a tied weight: the same memory as an earlier tensor, which `save_pretrained` writes once
        seen.add(view)
        tensor = tensor.detach()
        arrays[name] = tensor.float().numpy() if tensor.is_floating_point() else tensor.numpy()
    return arrays


def read_state_dict(source):
    """`{name: numpy array}`-like access to the checkpoint of a `PresetSource`:
    its safetensors, else its `pytorch_model.bin` (`load_torch_file`)."""
    try:
        return Checkpoint(source)
    except PresetFileError:
        pass
    return load_torch_file(source.require("pytorch_model.bin"))


class CheckpointLoader(TransformersPresetLoader):
    """The preset loader of a `transformers` checkpoint whose tensors come
    from `read_state_dict`: its safetensors, else its `pytorch_model.bin`
    (which loading at run time refuses). Building a model from it goes
    through the library's own strict loading (`from_preset`), so a
    converted preset is exactly what the library would load.

    Args:
        src: str, Path or PresetSource. A `transformers` checkpoint: a
            directory or `hf://org/repo[@revision]`.
    """

    def __init__(self, src):
        source = PresetSource.of(src)
        config = source.config()
        if is_native(config):
            raise ValueError(
                f"'{source.description}' is already a preset of attention_zoo_keras, not a transformers "
                "checkpoint to convert: load it with from_preset, or check it with `azk-convert verify`."
            )
        super().__init__(source, config, converter_for(config, source.description))

    def _open_checkpoint(self):
        """The checkpoint's tensors (`read_state_dict`)."""
        return read_state_dict(self.source)


def convert(model_cls, src):
    """A `model_cls` (a backbone or task class; tasks with their
    preprocessor) built from the `transformers` checkpoint `src` (a
    directory or `hf://org/repo[@revision]`), weights read with
    `read_state_dict`."""
    return model_cls.from_preset(CheckpointLoader(src))


def source_preprocessor(src):
    """The family's preprocessor (`TransformersConverter.preprocessor_cls`)
    built from the tokenizer files and settings of the checkpoint `src`, for
    a converted backbone preset to carry; `None` if the checkpoint has no
    tokenizer files."""
    source = PresetSource.of(src)
    preprocessor_cls = converter_for(source.config(), source.description).preprocessor_cls
    try:
        return preprocessor_cls.from_preset(source)
    except (PresetFileError, FileNotFoundError):
        return None
