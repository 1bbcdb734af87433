"""`backend_support.fill_columns`: the suppressed-token rule of a decoding step."""

import keras
import numpy as np

from attention_zoo_keras import backend_support


def test_fill_columns_sets_exactly_those_columns_on_every_row():
    scores = np.arange(12, dtype="float32").reshape(3, 4)
    filled = keras.ops.convert_to_numpy(backend_support.fill_columns(keras.ops.convert_to_tensor(scores), [0, 2], -5.0))
    expected = scores.copy()
    expected[:, [0, 2]] = -5.0
    np.testing.assert_array_equal(filled, expected)
