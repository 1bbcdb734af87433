"""One preset loader: a handle is resolved once into a loader that the
backbone, the task and the preprocessor ask for their config, their weights
and their tokenizer.

`get_preset_loader` reads the preset's `config.json` once and decides, in
this one place, whether it is a native preset (`NativePresetLoader`) or a
`transformers` checkpoint (`TransformersPresetLoader`, which finds the
family's converter once and opens the checkpoint once).

Loading is strict: every variable is filled (a converter may name optional
ones), every tensor is taken by a variable or knowingly dropped (another
task's head, a converter's `ignored_source_keys` / `head_keys`), every key of
a config file and every keyword argument is one the class takes, and the
sizes in a config are checked against the weights' headers before the model
is built. A task head that starts fresh (a classifier on a pretrained
encoder) is announced by a Python warning; a native task preset that lost its
head is an error.

A native backbone preset may carry task heads: tensors keyed
`heads/<TaskClassName>/<key of that task's head variable>` and, in
`config.json`, `"heads": {"<TaskClassName>": {task arguments}}` (written by
`save_preset_with_heads`); `<TaskClassName>.from_preset` builds the task with
those arguments and loads its head from those tensors. A head's entry may
also hold `"preprocessor": {settings}` that its preprocessor takes instead of
the shared ones (each ViLBERT head's task id).
"""

from attention_zoo_keras.hub.converters import converter_for
from attention_zoo_keras.hub.native_preset_loader import NativePresetLoader
from attention_zoo_keras.hub.preset_format import is_native
from attention_zoo_keras.hub.preset_loader_base import PresetLoader
from attention_zoo_keras.hub.source import PresetSource
from attention_zoo_keras.hub.transformers_preset_loader import TransformersPresetLoader


def get_preset_loader(preset, family=None, force_download=False):
    """The loader of `preset`: native or `transformers` format, decided once.

    Args:
        preset: str, PresetSource or PresetLoader. A named preset,
            `"hf://org/repo[@revision]"`, a local directory, a
            `PresetSource`, or a `PresetLoader` (returned as is).
        family: str or None. The model family a named preset must belong to, if any.
        force_download: bool. Download hub files again even if cached.

    Example:

    >>> loader = get_preset_loader("./my_bert")        # doctest: +SKIP
    >>> backbone = loader.build_backbone(BertBackbone)  # doctest: +SKIP
    >>> loader.load_backbone_weights(backbone)          # doctest: +SKIP
    """
    if isinstance(preset, PresetLoader):
        return preset
    source = PresetSource.of(preset, family=family, force_download=force_download)
    config = source.config()
    if is_native(config):
        return NativePresetLoader(source, config)
    return TransformersPresetLoader(source, config, converter_for(config, source.description))


def load_arrays(preset):
    """`{variable key: array}` of a preset, native or `transformers` format.

    Args:
        preset: str or PresetSource. A handle, as `get_preset_loader` takes.
    """
    return get_preset_loader(preset).arrays()
