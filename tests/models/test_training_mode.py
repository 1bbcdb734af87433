"""`fit`'s steps run a task in training mode and evaluation's do not.

Keras' trainers pass `training=True` only to a model whose `call` names
`training`; a `call(self, inputs, *args, **kwargs)` override silently
trains without dropout. With the learning rate 0 and dropout on, two
training steps on one batch must give different losses (other dropout
masks) and two evaluation steps the same one, for a task with one input
(ViT), with an optional input (Transformer-XL) and with several (BERT's
classifier, GPT's causal LM).
"""

import keras
import numpy as np
import pytest

from attention_zoo_keras.models import BertBackbone
from attention_zoo_keras.models import BertTextClassifier
from attention_zoo_keras.models import GPTBackbone
from attention_zoo_keras.models import GPTCausalLM
from attention_zoo_keras.models import ViTBackbone
from attention_zoo_keras.models import ViTImageClassifier
from attention_zoo_keras.models.transformer_xl import TransformerXLBackbone
from attention_zoo_keras.models.transformer_xl import TransformerXLCausalLM

DROPOUT = 0.5


def _vit():
    backbone = ViTBackbone(
        image_size=8, patch_size=4, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16, dropout=DROPOUT
    )
    images = np.random.default_rng(0).random((4, 8, 8, 3), dtype="float32")
    return ViTImageClassifier(backbone, num_classes=3), images, np.array([0, 1, 2, 1], "int32")


def _transformer_xl():
    backbone = TransformerXLBackbone(
        vocabulary_size=20, num_layers=1, num_heads=2, hidden_dim=8, head_dim=4, intermediate_dim=16, mem_len=4,
        dropout=DROPOUT,
    )
    tokens = np.random.default_rng(0).integers(0, 20, (2, 6)).astype("int32")
    # Every row starts afresh, so the memory a step leaves does not change the next step's loss.
    features = {"token_ids": tokens[:, :-1], "reset_memory": np.ones((2,), bool)}
    return TransformerXLCausalLM(backbone), features, tokens[:, 1:]


def _bert():
    backbone = BertBackbone(
        vocabulary_size=20, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16, max_sequence_length=6,
        dropout=DROPOUT,
    )
    token_ids = np.random.default_rng(0).integers(0, 20, (4, 6)).astype("int32")
    features = {"token_ids": token_ids, "segment_ids": np.zeros_like(token_ids), "padding_mask": np.ones_like(token_ids)}
    return BertTextClassifier(backbone, num_classes=2, dropout=DROPOUT), features, np.array([0, 1, 1, 0], "int32")


def _gpt():
    backbone = GPTBackbone(
        vocabulary_size=20, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16, max_sequence_length=6,
        dropout=DROPOUT,
    )
    tokens = np.random.default_rng(0).integers(0, 20, (2, 6)).astype("int32")
    features = {"token_ids": tokens[:, :-1], "padding_mask": np.ones((2, 5), "int32")}
    return GPTCausalLM(backbone), features, tokens[:, 1:]


@pytest.mark.parametrize("make", [_vit, _transformer_xl, _bert, _gpt], ids=["vit", "transformer_xl", "bert", "gpt"])
def test_training_steps_drop_out_and_evaluation_steps_do_not(make):
    keras.utils.set_random_seed(0)
    model, x, y = make()
    model.compile(optimizer=keras.optimizers.SGD(0.0))
    evaluated = [float(np.asarray(model.test_on_batch(x, y)).ravel()[0]) for _ in range(2)]
    trained = [float(np.asarray(model.train_on_batch(x, y)).ravel()[0]) for _ in range(2)]
    assert evaluated[0] == pytest.approx(evaluated[1], abs=1e-6)
    assert trained[0] != pytest.approx(trained[1], abs=1e-6), "training steps ran without dropout"
