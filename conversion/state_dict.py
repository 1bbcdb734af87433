"""Reading a `transformers` checkpoint's tensors for conversion: safetensors
if the repo has them, else its PyTorch `pytorch_model.bin`, strictly with
`torch.load(weights_only=True)`, which refuses to unpickle anything but
tensors and plain containers. (Loading at run time never reads `.bin`.)"""

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

    state = torch.load(binary, map_location="cpu", weights_only=True)
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
