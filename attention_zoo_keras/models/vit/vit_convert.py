"""Converts Hugging Face `transformers` ViT checkpoints: `ViTModel` (with or
without its pooler), and `ViTForImageClassification` /
`ViTForMaskedImageModeling` with their `vit.` prefix.

torch `nn.Linear` weights `(out, in)` are transposed into Keras kernels
`(in, out)`; the patch projection's `nn.Conv2d` weight `(out, in, kh, kw)`
becomes a channels-last `Conv2D` kernel `(kh, kw, in, out)`. transformers
stores the class token `(1, 1, D)` and the positions `(1, 1 + N, D)` as one
tensor each; the positions are split into the class position and the
`(grid_h, grid_w, D)` patch grid (row-major, as the patches are flattened).
"""

import collections
import inspect
import json
import logging

import numpy as np

from attention_zoo_keras.hub.converters import TransformersConverter
from attention_zoo_keras.hub.converters import copy_dense
from attention_zoo_keras.hub.converters import copy_layer_norm
from attention_zoo_keras.hub.converters import NotExportableError
from attention_zoo_keras.hub.converters import register_converter
from attention_zoo_keras.layers.activations import get_activation
from attention_zoo_keras.layers.patch_embedding import as_pair
from attention_zoo_keras.models.vit.vit_backbone import ViTBackbone
from attention_zoo_keras.models.vit.vit_image_converter import ViTImageConverter
from attention_zoo_keras.models.vit.vit_position_embedding import resize_patch_positions

logger = logging.getLogger(__name__)

CLASSIFICATION_ARCHITECTURE = "ViTForImageClassification"
# PIL's resampling filter codes, which `preprocessor_config.json` stores.
RESAMPLE_FILTERS = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}
# `ViTImageProcessor`'s defaults.
IMAGE_PROCESSOR_DEFAULTS = {
    "do_resize": True,
    "resample": 2,
    "do_rescale": True,
    "rescale_factor": 1 / 255,
    "do_normalize": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
}


def _check_supported(hf_config):
    """Raises for ViT variants this backbone does not compute."""
    problems = []
    activation = hf_config.get("hidden_act", "gelu")
    try:
        get_activation(activation)
    except ValueError:
        problems.append(f"'hidden_act' is '{activation}', an activation this library lacks")
    hidden_dim = hf_config.get("hidden_size", 768)
    num_heads = hf_config.get("num_attention_heads", 12)
    head_dim = hf_config.get("head_dim")
    if head_dim is not None and head_dim * num_heads != hidden_dim:
        problems.append(
            f"'head_dim' is {head_dim}, not hidden_size / num_attention_heads = {hidden_dim} / {num_heads}"
        )
    if problems:
        raise ValueError("This ViT checkpoint cannot be converted: " + "; ".join(problems) + ".")
    if not hf_config.get("qkv_bias", True):
        logger.info("'qkv_bias' is false: the query, key and value projections get zero biases (same outputs).")


def _prefix(checkpoint):
    """`"vit."` for the task models' checkpoints, `""` for `ViTModel`'s."""
    for prefix in ("", "vit."):
        if f"{prefix}embeddings.cls_token" in checkpoint:
            return prefix
    raise ValueError(
        "This checkpoint has no 'embeddings.cls_token' (with or without the 'vit.' prefix); "
        "it is not a ViT checkpoint."
    )


def _grid_size(hf_config):
    image_size = as_pair(hf_config.get("image_size", 224), "image_size")
    patch_size = as_pair(hf_config.get("patch_size", 16), "patch_size")
    return image_size[0] // patch_size[0], image_size[1] // patch_size[1]


def _image_size(size, source_description):
    """`(height, width)` from a processor's `size`: an int, `[h, w]` or `{height, width}`."""
    if isinstance(size, dict) and {"height", "width"} <= set(size):
        return size["height"], size["width"]
    if isinstance(size, int) or (isinstance(size, (list, tuple)) and len(size) == 2):
        return as_pair(size, "size")
    raise ValueError(
        f"'size' in preprocessor_config.json of '{source_description}' is {size!r}; a ViT "
        "processor resizes to a fixed size: an int, [height, width] or {'height': h, 'width': w}."
    )


class ViTConverter(TransformersConverter):
    """Reads `transformers` ViT checkpoints.

    Besides the backbone's weights, `weights()` returns the classification
    head of `ViTForImageClassification` as `classifier/kernel` `(hidden_dim,
    num_labels)` and `classifier/bias` — the weights of a `Dense` layer named
    `"classifier"` applied to `sequence_output[:, 0]` (no pooler, no tanh).
    """

    model_type = "vit"
    backbone_cls = ViTBackbone
    preprocessor_cls = ViTImageConverter
    # What `ViTForMaskedImageModeling` adds for pre-training, which this
    # library does not compute: its decoder and the mask token.
    ignored_source_keys = (r"decoder\..*", r"(vit\.)?embeddings\.mask_token", r".*position_ids")
    head_keys = (r"pooler/.*", r"classifier/.*")
    checkpoint_sizes = {
        "hidden_dim": ("class_token/embedding", 0),
        "num_channels": ("patch_embedding/projection/kernel", 2),
        "intermediate_dim": ("transformer_layer_0/feed_forward/intermediate/kernel", 1),
    }

    def backbone_config(self, hf_config):
        _check_supported(hf_config)
        return {
            "image_size": hf_config.get("image_size", 224),
            "patch_size": hf_config.get("patch_size", 16),
            "num_channels": hf_config.get("num_channels", 3),
            "num_layers": hf_config.get("num_hidden_layers", 12),
            "num_heads": hf_config.get("num_attention_heads", 12),
            "hidden_dim": hf_config.get("hidden_size", 768),
            "intermediate_dim": hf_config.get("intermediate_size", 3072),
            "dropout": hf_config.get("hidden_dropout_prob", 0.0),
            "attention_dropout": hf_config.get("attention_probs_dropout_prob", 0.0),
            "layer_norm_epsilon": hf_config.get("layer_norm_eps", 1e-12),
            "activation": hf_config.get("hidden_act", "gelu"),
            "initializer_range": hf_config.get("initializer_range", 0.02),
        }

    def checkpoint_arguments(self, hf_config, checkpoint, arguments):
        """`use_pooler` exactly when the checkpoint holds a pooler (`ViTModel`
        saves one unless built with `add_pooling_layer=False`;
        `ViTForImageClassification` has none), unless chosen already."""
        if "use_pooler" in arguments:
            return {}
        return {"use_pooler": self.has_pooler(hf_config, checkpoint)}

    def adapt_arrays(self, backbone, arrays, source_description):
        """A checkpoint's patch position grid of another size (a model built
        with another `image_size`) resized to `backbone`'s grid by
        `resize_patch_positions` (bicubic, as `interpolate_pos_encoding`)."""
        key = backbone.position_embedding.patch_positions.path
        if key not in arrays:
            return arrays
        shape = tuple(arrays.shape(key)) if hasattr(arrays, "shape") else tuple(arrays[key].shape)
        if len(shape) != 3 or shape[2] != backbone.hidden_dim or shape[:2] == backbone.grid_size:
            return arrays
        logger.info(
            "Resizing the patch position embeddings of '%s' from a %s grid to %s.",
            source_description, shape[:2], backbone.grid_size,
        )
        return collections.ChainMap({key: resize_patch_positions(arrays[key], backbone.grid_size)}, arrays)

    def has_pooler(self, hf_config, checkpoint):
        """Whether the checkpoint holds `ViTPooler` weights (of the one
        pooler this library computes: tanh, `hidden_size` wide)."""
        if f"{_prefix(checkpoint)}pooler.dense.weight" not in checkpoint:
            return False
        activation = hf_config.get("pooler_act", "tanh")
        width = hf_config.get("pooler_output_size") or hf_config.get("hidden_size", 768)
        if activation != "tanh" or width != hf_config.get("hidden_size", 768):
            raise ValueError(
                f"This ViT checkpoint's pooler ('pooler_act' '{activation}', 'pooler_output_size' "
                f"{width}) cannot be converted: only a tanh pooler of width hidden_size can. Load it "
                "with use_pooler=False to drop the pooler."
            )
        return True

    def weights(self, hf_config, checkpoint):
        prefix = _prefix(checkpoint)
        hidden_dim = hf_config.get("hidden_size", 768)
        grid_size = _grid_size(hf_config)
        embeddings = f"{prefix}embeddings"
        positions = np.asarray(checkpoint[f"{embeddings}.position_embeddings"])
        if positions.shape != (1, 1 + grid_size[0] * grid_size[1], hidden_dim):
            raise ValueError(
                f"'{embeddings}.position_embeddings' has shape {positions.shape}, but image_size and "
                f"patch_size in config.json give a {grid_size} patch grid: expected "
                f"{(1, 1 + grid_size[0] * grid_size[1], hidden_dim)}."
            )
        arrays = {
            "class_token/embedding": np.reshape(checkpoint[f"{embeddings}.cls_token"], (hidden_dim,)),
            "position_embedding/class_position": positions[0, 0],
            "position_embedding/patch_positions": positions[0, 1:].reshape(*grid_size, hidden_dim),
            "patch_embedding/projection/kernel": np.transpose(
                checkpoint[f"{embeddings}.patch_embeddings.projection.weight"], (2, 3, 1, 0)
            ),
            "patch_embedding/projection/bias": checkpoint[f"{embeddings}.patch_embeddings.projection.bias"],
        }
        qkv_bias = hf_config.get("qkv_bias", True)
        for index in range(hf_config.get("num_hidden_layers", 12)):
            theirs = f"{prefix}encoder.layer.{index}"
            ours = f"transformer_layer_{index}"
            copy_layer_norm(arrays, f"{ours}/attention_norm", f"{theirs}.layernorm_before", checkpoint)
            for projection in ("query", "key", "value"):
                source = f"{theirs}.attention.attention.{projection}"
                target = f"{ours}/self_attention/{projection}"
                if qkv_bias:
                    copy_dense(arrays, target, source, checkpoint)
                else:
                    kernel = np.asarray(checkpoint[f"{source}.weight"]).T
                    arrays[f"{target}/kernel"] = kernel
                    arrays[f"{target}/bias"] = np.zeros(kernel.shape[1], dtype=kernel.dtype)
            copy_dense(arrays, f"{ours}/self_attention/output", f"{theirs}.attention.output.dense", checkpoint)
            copy_layer_norm(arrays, f"{ours}/output_norm", f"{theirs}.layernorm_after", checkpoint)
            copy_dense(arrays, f"{ours}/feed_forward/intermediate", f"{theirs}.intermediate.dense", checkpoint)
            copy_dense(arrays, f"{ours}/feed_forward/output", f"{theirs}.output.dense", checkpoint)
        copy_layer_norm(arrays, "final_norm", f"{prefix}layernorm", checkpoint)
        if f"{prefix}pooler.dense.weight" in checkpoint:
            copy_dense(arrays, "pooler", f"{prefix}pooler.dense", checkpoint)
        if "classifier.weight" in checkpoint:
            copy_dense(arrays, "classifier", "classifier", checkpoint)
        return arrays

    def task_config(self, task_cls, source, hf_config):
        """Label settings of a `ViTForImageClassification` checkpoint:

        - `num_classes`: its number of labels (`id2label`'s size, else
          `num_labels`, else transformers' default 2);
        - `class_names`: the label names in id order (`id2label`; transformers'
          `LABEL_i` when config.json has none).

        Each is returned only to a task whose constructor names it (the image
        classifier), and nothing for other checkpoints.
        """
        if CLASSIFICATION_ARCHITECTURE not in hf_config.get("architectures", []):
            return {}
        labels = hf_config.get("id2label") or {}
        num_classes = len(labels) or hf_config.get("num_labels", 2)
        names = [labels.get(str(i), f"LABEL_{i}") for i in range(num_classes)]
        parameters = inspect.signature(task_cls.__init__).parameters
        settings = {"num_classes": num_classes, "class_names": names}
        return {key: value for key, value in settings.items() if key in parameters}

    def preprocessor_config(self, source, hf_config):
        """Image settings from the repo's `preprocessor_config.json`, with
        `ViTImageProcessor`'s defaults for what it omits (and the model's
        image size when the repo has no such file):

        - `image_size`: `(height, width)` images are resized to;
        - `do_resize`, `resample`: whether to resize, and the filter's name
          (`"bilinear"` — the default —, `"bicubic"`, `"nearest"`,
          `"lanczos"`, `"box"` or `"hamming"`, PIL's filters);
        - `do_rescale`, `rescale_factor`: pixels are multiplied by it (1/255);
        - `do_normalize`, `image_mean`, `image_std`: then `(x − mean) / std`
          per channel (lists of floats; one value for all channels if the
          file gives a scalar).
        """
        settings = {**IMAGE_PROCESSOR_DEFAULTS, **(source.json("preprocessor_config.json", required=False) or {})}
        size = settings.get("size", hf_config.get("image_size", 224))
        return {
            "image_size": _image_size(size, source.description),
            "do_resize": bool(settings["do_resize"]),
            "resample": RESAMPLE_FILTERS.get(settings["resample"], settings["resample"]),
            "do_rescale": bool(settings["do_rescale"]),
            "rescale_factor": float(settings["rescale_factor"]),
            "do_normalize": bool(settings["do_normalize"]),
            "image_mean": [float(value) for value in np.ravel(settings["image_mean"])],
            "image_std": [float(value) for value in np.ravel(settings["image_std"])],
        }

    transformers_architectures = {"ViTBackbone": "ViTModel", "ViTImageClassifier": CLASSIFICATION_ARCHITECTURE}

    transformers_names = {
        "num_channels": "num_channels", "num_layers": "num_hidden_layers", "num_heads": "num_attention_heads",
        "hidden_dim": "hidden_size", "intermediate_dim": "intermediate_size", "dropout": "hidden_dropout_prob",
        "attention_dropout": "attention_probs_dropout_prob", "layer_norm_epsilon": "layer_norm_eps",
        "activation": "hidden_act", "initializer_range": "initializer_range",
    }

    def transformers_config(self, model):
        hf_config = super().transformers_config(model)
        backbone = getattr(model, "backbone", model)
        hf_config.update(
            image_size=list(backbone.image_size), patch_size=list(backbone.patch_size), qkv_bias=True
        )
        if backbone is not model:
            if model.pooling != "token":
                raise NotExportableError(
                    f"transformers' {CLASSIFICATION_ARCHITECTURE} classifies the class token; this "
                    f"ViTImageClassifier pools '{model.pooling}'."
                )
            names = model.class_names or [f"LABEL_{i}" for i in range(model.num_classes)]
            hf_config["id2label"] = {str(i): name for i, name in enumerate(names)}
            hf_config["label2id"] = {name: i for i, name in enumerate(names)}
        return hf_config

    def export_preprocessor(self, preprocessor, directory):
        filters = {name: code for code, name in RESAMPLE_FILTERS.items()}
        height, width = preprocessor.image_size
        settings = {
            "image_processor_type": "ViTImageProcessor",
            "size": {"height": height, "width": width},
            "do_resize": preprocessor.do_resize,
            "resample": filters[preprocessor.resample],
            "do_rescale": preprocessor.do_rescale,
            "rescale_factor": preprocessor.rescale_factor,
            "do_normalize": preprocessor.do_normalize,
            "image_mean": preprocessor.image_mean.tolist(),
            "image_std": preprocessor.image_std.tolist(),
        }
        (directory / "preprocessor_config.json").write_text(json.dumps(settings, indent=2, sort_keys=True) + "\n")


register_converter(ViTConverter())
