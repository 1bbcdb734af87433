"""What every verifier shares to run our model and its reference on the
same inputs and compare them: the reference checkpoint's files, seeded random
token batches with one right-padded row, and the largest |ours - reference|.
"""

import keras
import numpy as np

SEED = 0
# How long the random sequences are (at most; shorter if the model is).
SEQUENCE_LENGTH = 16
BATCH_SIZE = 2


def reference_directory(source):
    """The local directory of a `transformers` checkpoint, its config and
    weights downloaded (through `huggingface_hub` for `hf://` sources).

    Args:
        source: PresetSource. The checkpoint a preset was converted from.
    """
    config_path = source.require("config.json")
    if source.file("model.safetensors") is None and source.file("model.safetensors.index.json") is None:
        source.require("pytorch_model.bin")
    return config_path.parent


def max_abs_difference(ours, theirs, where=None):
    """The largest |ours - theirs|, in float64.

    Args:
        ours: tensor. Our model's output.
        theirs: array. The reference's output, of the same shape.
        where: array of bool or None. The positions to compare (the real,
            unpadded ones); all if `None`.

    Raises:
        ValueError: the shapes differ.
    """
    ours, theirs = np.asarray(keras.ops.convert_to_numpy(ours), "float64"), np.asarray(theirs, "float64")
    if ours.shape != theirs.shape:
        raise ValueError(f"output shapes differ: ours {ours.shape}, reference {theirs.shape}")
    if where is not None:
        ours, theirs = ours[where], theirs[where]
    return float(np.max(np.abs(ours - theirs)))


def padding_mask(batch, length):
    """Ones, but the last row is right-padded to about half its length.

    Args:
        batch: int. The number of rows.
        length: int. The length of each.
    """
    mask = np.ones((batch, length), "int32")
    if batch > 1:
        mask[-1, max(1, length // 2) :] = 0
    return mask


def random_token_batch(config):
    """`(rng, token_ids, padding_mask)`: `BATCH_SIZE` random sequences of ids
    below the model's `vocabulary_size`, `SEQUENCE_LENGTH` long (or its
    `max_sequence_length` if shorter), the last one right-padded
    (`padding_mask`); `rng` (seed `SEED`) draws any other inputs after them.

    Args:
        config: dict. A backbone's config, with `vocabulary_size` and
            `max_sequence_length`.
    """
    rng = np.random.default_rng(SEED)
    length = min(SEQUENCE_LENGTH, config["max_sequence_length"])
    token_ids = rng.integers(0, config["vocabulary_size"], (BATCH_SIZE, length)).astype("int32")
    return rng, token_ids, padding_mask(BATCH_SIZE, length)
