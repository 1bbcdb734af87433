"""Checkpoint averaging (Vaswani et al., 2017, "Attention Is All You Need",
§6.1: the base models use "a single model obtained by averaging the last 5
checkpoints", the big ones the last 20):

    θ = (1 / N) · Σ_{i=1..N} θ_i

for every variable θ, over checkpoints θ_1..θ_N saved near the end of
training. `KeepLastCheckpoints` saves a preset every epoch (or every few
steps) and keeps the last N; `average_checkpoints` loads their mean.
"""

import os
import shutil
from pathlib import Path

import keras
import numpy as np

from attention_zoo_keras.hub.preset_loader import load_arrays
from attention_zoo_keras.hub.source import PresetSource
from attention_zoo_keras.hub.weights import assign_weights
from attention_zoo_keras.hub.weights import check_arrays
from attention_zoo_keras.hub.weights import variables_by_key


def average_checkpoints(model, checkpoints):
    """Sets every variable of `model` to its mean over `checkpoints`.

    Args:
        model: keras.Model. A built model, e.g. a `Backbone` or a `Task`.
        checkpoints: list of str or Path. The presets, usually directories
            written by `model.save_to_preset` (such as
            `KeepLastCheckpoints.paths`); any preset handle works. Weights
            are matched by variable path.

    The mean is taken in float64 and cast to each variable's dtype. The
    model is changed only if every checkpoint holds every variable, with
    the variable's shape.

    Raises:
        TypeError: a single preset instead of a list.
        ValueError: no checkpoint; a model with no variables; a checkpoint
            lacking variables (named); a variable whose shape differs from
            the model's in a checkpoint (naming the variable, the checkpoint
            and both shapes).
        PresetFileError: a checkpoint that is missing or unreadable.

    Example:

    >>> import tempfile, numpy as np, attention_zoo_keras as azk
    >>> model = azk.models.BertBackbone(vocabulary_size=10, num_layers=1, num_heads=1,
    ...                                 hidden_dim=4, intermediate_dim=4)
    >>> kernel = model.get_layer("pooler").kernel
    >>> first_kernel = keras.ops.convert_to_numpy(kernel)
    >>> directory = tempfile.TemporaryDirectory()
    >>> model.save_to_preset(f"{directory.name}/first")
    >>> _ = kernel.assign(first_kernel + 1.0)
    >>> model.save_to_preset(f"{directory.name}/second")
    >>> average_checkpoints(model, [f"{directory.name}/first", f"{directory.name}/second"])
    >>> np.allclose(keras.ops.convert_to_numpy(kernel), first_kernel + 0.5)
    True
    >>> directory.cleanup()
    """
    if isinstance(checkpoints, (str, os.PathLike)):
        raise TypeError(f"checkpoints must be a list of presets; got the single preset {str(checkpoints)!r}.")
    sources = [PresetSource.of(checkpoint) for checkpoint in checkpoints]
    if not sources:
        raise ValueError("average_checkpoints needs at least one checkpoint; got none.")
    variables = variables_by_key(model)
    if not variables:
        raise ValueError(f"Model '{model.name}' has no variables to average; build it first.")
    checkpoint_arrays = [load_arrays(source) for source in sources]
    for source, arrays in zip(sources, checkpoint_arrays):
        check_arrays(variables, arrays, source.description)
    means = {}
    for key, variable in variables.items():
        total = sum(np.asarray(arrays[key], dtype="float64") for arrays in checkpoint_arrays)
        means[key] = np.asarray(total / len(sources), dtype=variable.dtype)
    assign_weights(variables, means, "the average of " + ", ".join(source.description for source in sources))


class KeepLastCheckpoints(keras.callbacks.Callback):
    """Saves the model as a preset during training, keeping the last `keep`.

    Args:
        directory: str or Path. Where the presets go: `epoch_001`,
            `epoch_002`, ... (or `step_000500`, ... when saving every
            `save_freq` steps).
        keep: int. How many of the newest presets to keep; older ones are
            deleted.
        save_freq: str or int. `"epoch"` to save at the end of every epoch,
            or an int to save every that many training steps.

    `paths` lists the presets kept, oldest first, so
    `average_checkpoints(model, callback.paths)` averages the last `keep`.
    The model must have `save_to_preset` (every `Backbone` and `Task` has).

    Example:

    >>> import tempfile, numpy as np, attention_zoo_keras as azk
    >>> backbone = azk.models.BertBackbone(vocabulary_size=10, num_layers=1, num_heads=1,
    ...                                    hidden_dim=4, intermediate_dim=4)
    >>> classifier = azk.models.BertTextClassifier(backbone=backbone, num_classes=2)
    >>> ids = np.ones((4, 3), "int32")
    >>> features = {"token_ids": ids, "segment_ids": 0 * ids, "padding_mask": ids}
    >>> directory = tempfile.TemporaryDirectory()
    >>> keep_last = KeepLastCheckpoints(directory.name, keep=2)
    >>> _ = classifier.fit(features, np.array([0, 1, 0, 1]), epochs=3, callbacks=[keep_last], verbose=0)
    >>> [path.name for path in keep_last.paths]
    ['epoch_002', 'epoch_003']
    >>> average_checkpoints(classifier, keep_last.paths)
    >>> directory.cleanup()
    """

    def __init__(self, directory, keep=5, save_freq="epoch"):
        super().__init__()
        if not isinstance(keep, int) or keep < 1:
            raise ValueError(f"keep must be a positive int; got {keep!r}.")
        if save_freq != "epoch" and (not isinstance(save_freq, int) or save_freq < 1):
            raise ValueError(f"save_freq must be 'epoch' or a positive int; got {save_freq!r}.")
        self.directory = Path(directory).expanduser()
        self.keep = keep
        self.save_freq = save_freq
        self.paths = []
        self._steps = 0
        self._steps_at_last_save = 0
        self._last_batch = -1

    def on_train_begin(self, logs=None):
        if not hasattr(self.model, "save_to_preset"):
            raise TypeError(
                f"KeepLastCheckpoints saves with `save_to_preset`, which the "
                f"{type(self.model).__name__} '{self.model.name}' lacks; train an "
                "attention_zoo_keras Backbone or Task."
            )

    def on_epoch_begin(self, epoch, logs=None):
        self._last_batch = -1

    def on_train_batch_end(self, batch, logs=None):
        if self.save_freq == "epoch":
            return
        self._steps += batch - self._last_batch  # more than 1 with steps_per_execution
        self._last_batch = batch
        if self._steps - self._steps_at_last_save >= self.save_freq:
            self._steps_at_last_save = self._steps
            self._save(f"step_{self._steps:06d}")

    def on_epoch_end(self, epoch, logs=None):
        if self.save_freq == "epoch":
            self._save(f"epoch_{epoch + 1:03d}")

    def _save(self, name):
        path = self.directory / name
        self.model.save_to_preset(path)
        if path in self.paths:  # a second `fit` saving under the same name
            self.paths.remove(path)
        self.paths.append(path)
        while len(self.paths) > self.keep:
            shutil.rmtree(self.paths.pop(0), ignore_errors=True)
