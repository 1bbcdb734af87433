"""The check that a converted ViLBERT preset loads back unchanged: no
reference implementation of the authors' code can be installed here, so each
task as written (to a temporary directory beside DEST) is loaded back with
`from_preset` and must give the in-memory model's outputs on random inputs,
its preprocessor and tokenizer the same settings and ids.
"""

import keras
import numpy as np

from attention_zoo_keras.conversion.vilbert_conversion import ConversionError
from attention_zoo_keras.models.vilbert import ViLBERTImageTextRetriever
from attention_zoo_keras.models.vilbert import ViLBERTPretrainer

VERIFY_SEED = 1234
TOLERANCE = 1e-6


def random_inputs(model, seed=VERIFY_SEED, batch=2, length=8, regions=5):
    """Random feature inputs for `model` (a candidates axis for the retriever)."""
    backbone = model.backbone
    rng = np.random.default_rng(seed)
    length = min(length, backbone.max_sequence_length)
    token_ids = rng.integers(0, backbone.vocabulary_size, size=(batch, length)).astype("int32")
    padding_mask = np.ones((batch, length), "int32")
    padding_mask[-1, length // 2:] = 0
    region_mask = np.ones((batch, regions), "int32")
    region_mask[-1, regions - 1:] = 0
    boxes = np.sort(rng.uniform(size=(batch, regions, 2, 2)), axis=2).reshape(batch, regions, 4)[..., [0, 2, 1, 3]]
    area = (boxes[..., 2] - boxes[..., 0]) * (boxes[..., 3] - boxes[..., 1])
    x = {
        "token_ids": token_ids,
        "segment_ids": np.zeros_like(token_ids),
        "padding_mask": padding_mask,
        "region_features": rng.normal(size=(batch, regions, backbone.region_feature_dim)).astype("float32"),
        "region_boxes": np.concatenate([boxes, area[..., None]], axis=-1).astype("float32"),
        "region_mask": region_mask,
    }
    if backbone.num_task_tokens:
        x["task_ids"] = rng.integers(0, backbone.num_task_tokens, size=(batch, 1)).astype("int32")
    if isinstance(model, ViLBERTPretrainer):
        x["mask_positions"] = np.tile(np.arange(min(3, length), dtype="int32"), (batch, 1))
    if isinstance(model, ViLBERTImageTextRetriever):
        x = {name: value[None] for name, value in x.items()}  # one query, `batch` candidates
    return x


def outputs_of(model, x):
    """The model's outputs as `{name: numpy array}`."""
    outputs = model(x, training=False)
    if not isinstance(outputs, dict):
        outputs = {"output": outputs}
    return {name: keras.ops.convert_to_numpy(value) for name, value in outputs.items()}


def verify(models, directory, preprocessor=None):
    """Max |in-memory − reloaded from `directory`| over the outputs of every
    task in `models` on random inputs; raises `ConversionError` if the
    preset (its preprocessor too) does not load back as it was."""
    if preprocessor is not None:
        reloaded = type(preprocessor).from_preset(str(directory))
        for name in ("sequence_length", "max_regions", "task_id"):
            if getattr(reloaded, name, None) != getattr(preprocessor, name, None):
                raise ConversionError(f"The reloaded preprocessor's {name} differs from the converted one's.")
        text = ["a man riding a horse on a beach"]
        if reloaded.tokenizer.encode(text) != preprocessor.tokenizer.encode(text):
            raise ConversionError("The reloaded tokenizer encodes differently from the converted one.")
    difference = 0.0
    for model in models:
        x = random_inputs(model)
        expected = outputs_of(model, x)
        actual = outputs_of(type(model).from_preset(str(directory), preprocessor=None), x)
        if set(expected) != set(actual):
            raise ConversionError(
                f"The reloaded {type(model).__name__}'s outputs {sorted(actual)} differ from {sorted(expected)}."
            )
        for name, value in expected.items():
            if not np.all(np.isfinite(value)):
                raise ConversionError(
                    f"The converted {type(model).__name__}'s '{name}' output is not finite on random inputs."
                )
            difference = max(difference, float(np.max(np.abs(value - actual[name]))))
    return difference
