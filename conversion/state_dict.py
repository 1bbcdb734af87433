"""Reading a `transformers` checkpoint's tensors for conversion: safetensors
if the repo has them, else its PyTorch `pytorch_model.bin`, strictly with
`torch.load(weights_only=True)`, which refuses to unpickle anything but
tensors and plain containers. (Loading at run time never reads `.bin`.)"""

import pickle

import attention_zoo_keras as azk
from attention_zoo_keras.hub.converters import converter_for
from attention_zoo_keras.hub.source import PresetSource
from attention_zoo_keras.hub.weights import Checkpoint


def read_state_dict(source):
    """`{name: numpy array}`-like access to the checkpoint of a `PresetSource`."""
    try:
        return Checkpoint(source)
    except azk.hub.PresetFileError:
        pass
    binary = source.require("pytorch_model.bin")
    import torch

    try:
        state = torch.load(binary, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        raise azk.hub.PresetFileError(
            f"'{binary}' holds more than tensors, so it was not loaded (torch.load(weights_only=True)): {error}"
        ) from error
    return {name: tensor.float().numpy() if tensor.is_floating_point() else tensor.numpy() for name, tensor in state.items()}


def convert(model_cls, src):
    """A `model_cls` (a backbone or task class; tasks with their
    preprocessor) built from the `transformers` checkpoint `src` (a
    directory or `hf://org/repo[@revision]`), weights read with
    `read_state_dict`."""
    source = PresetSource.of(src)
    config = source.config()
    converter = converter_for(config, source.description)
    model = model_cls.from_preset(source, load_weights=False)
    model.assign_arrays(converter.weights(config, read_state_dict(source)), source.description, converter.optional_keys)
    return model


def source_preprocessor(src):
    """The family's preprocessor (`TransformersConverter.preprocessor_cls`)
    built from the tokenizer files and settings of the checkpoint `src`, for
    a converted backbone preset to carry; `None` if the checkpoint has no
    tokenizer files."""
    source = PresetSource.of(src)
    preprocessor_cls = converter_for(source.config(), source.description).preprocessor_cls
    try:
        return preprocessor_cls.from_preset(source)
    except (azk.hub.PresetFileError, FileNotFoundError):
        return None
