"""Raw inputs (strings, images) fed to `fit` / `predict` batch by batch
through a task's preprocessor."""

import math

import keras
import numpy as np


def take(data, indices):
    """The examples at `indices` of `data`: an array, list, tuple or dict of them."""
    if data is None:
        return None
    if isinstance(data, dict):
        return {key: take(value, indices) for key, value in data.items()}
    if isinstance(data, tuple):
        return tuple(take(part, indices) for part in data)
    if isinstance(data, np.ndarray):
        return data[indices]
    return [data[i] for i in indices]


class PreprocessedBatches(keras.utils.PyDataset):
    """A `keras.utils.PyDataset` that preprocesses raw examples per batch.

    Args:
        preprocessor: Preprocessor. Called as
            `preprocessor(x, y, sample_weight)` on each batch.
        x: list, tuple, dict or numpy.ndarray. Raw inputs (e.g. a list of
            strings, or a tuple of two for pairs).
        y: array-like or None. Labels, one per example.
        sample_weight: array-like or None. Per-example weights.
        batch_size: int. Examples per batch.
        shuffle: bool. Reshuffle the order at the start and after every
            epoch.
        seed: int or None. Seed of the shuffle; `None`: drawn from numpy's
            global generator, so `keras.utils.set_random_seed` makes it
            reproducible.

    The model checks each batch (the preprocessor may produce ids or lengths
    the model cannot take) by wrapping this dataset (`checked_batches`).
    """

    def __init__(self, preprocessor, x, y=None, sample_weight=None, batch_size=32, shuffle=False, seed=None, **kwargs):
        super().__init__(**kwargs)
        self.preprocessor = preprocessor
        self.x, self.y, self.sample_weight = x, y, sample_weight
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.num_examples = preprocessor.num_examples(x)
        if y is not None and len(y) != self.num_examples:
            raise ValueError(f"Got {self.num_examples} inputs but {len(y)} labels.")
        if seed is None:  # from numpy's global generator, which keras.utils.set_random_seed seeds
            seed = np.random.randint(2**31 - 1)
        self._rng = np.random.default_rng(seed)
        self._order = np.arange(self.num_examples)
        if shuffle:
            self._rng.shuffle(self._order)

    @property
    def widths_vary(self):
        """Whether batches may differ in width (`Preprocessor.widths_vary`)."""
        return self.preprocessor.widths_vary

    def __len__(self):
        return math.ceil(self.num_examples / self.batch_size)

    def __getitem__(self, index):
        indices = self._order[index * self.batch_size : (index + 1) * self.batch_size]
        return self.preprocessor(
            self.preprocessor.examples(self.x, indices),
            None if self.y is None else take(np.asarray(self.y), indices),
            None if self.sample_weight is None else take(np.asarray(self.sample_weight), indices),
        )

    def widest(self):
        """The widest batch's width: the largest size after the batch axis of
        any integer feature (token ids, masks) of any batch. Preprocesses
        every batch once."""
        widths = []
        for index in range(len(self)):
            batch = self[index]
            features = batch[0] if isinstance(batch, tuple) else batch
            widths += [np.shape(value)[1] for value in keras.tree.flatten(features)
                       if np.ndim(value) >= 2 and np.issubdtype(np.asarray(value).dtype, np.integer)]
        return max(widths, default=0)

    def on_epoch_end(self):
        if self.shuffle:
            self._rng.shuffle(self._order)

