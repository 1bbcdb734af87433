"""Grid regions for ViLBERT (Lu et al., 2019, "ViLBERT: Pretraining
Task-Agnostic Visiolinguistic Representations for Vision-and-Language
Tasks") without an object detector: the grid features of a pretrained image
backbone (a `ViTBackbone`'s patches, or a CNN's feature map) as the regions,

    feature_(i, j) = F(image)[i, j],    box_(i, j) = the pixels of grid cell (i, j)

listed row-major, for `region_inputs`. ViLBERT was pretrained on detector
regions, so such regions suit fine-tuning or training from scratch rather
than the authors' checkpoints as they are.
"""

import numbers

import keras
import numpy as np

from attention_zoo_keras.models.vilbert.vilbert_region_inputs import grid_boxes


def _run_in_batches(model, inputs, batch_size):
    """The model's outputs on `inputs` (an array or a dict of arrays whose
    first axis is the batch), as numpy, computed `batch_size` images at a time."""
    count = len(next(iter(inputs.values())) if isinstance(inputs, dict) else inputs)
    step = count if batch_size is None else batch_size
    chunks = []
    for start in range(0, count, max(step, 1)):
        chunk = (
            {name: value[start : start + step] for name, value in inputs.items()}
            if isinstance(inputs, dict)
            else inputs[start : start + step]
        )
        chunks.append(keras.tree.map_structure(keras.ops.convert_to_numpy, model(chunk, training=False)))
    return keras.tree.map_structure(lambda *parts: np.concatenate(parts, axis=0), *chunks)


def image_grid_regions(image_backbone, images, batch_size=None):
    """Grid features of a pretrained image backbone as ViLBERT regions.

    For users without an object detector: every cell of the backbone's
    feature grid becomes one region, its feature the backbone's output there
    and its box the cell's pixels. The result feeds `region_inputs`, which
    adds the global region and the padding (raise its `max_regions` to at
    least `grid cells + 1`).

    Two kinds of backbone are understood:

    - this library's `ViTBackbone`: its `sequence_output` `(batch, 1 +
      num_patches, hidden_dim)` without the class token; the patches are
      row-major over the `image_size // patch_size` grid and each box is its
      patch's pixels.
    - any `keras.Model` whose output is one channels-last feature map
      `(batch, H', W', C)`, e.g. a `keras.applications` CNN built with
      `include_top=False`: the map flattened row-major, the boxes an even
      `H'` × `W'` grid over the model's input height and width (the images'
      own size where the model's input size is unspecified). The cells stand
      for the map's positions; they are not the CNN's receptive fields.

    Args:
        image_backbone: `ViTBackbone` or `keras.Model`. A `ViTBackbone`, or
            a model with a 4-D feature-map output.
        images: numpy array of shape `(batch, height, width, channels)`.
            Already resized and normalised for the backbone.
        batch_size: int or None. The images per forward pass; `None` runs
            the whole batch at once.

    Returns:
        `(features, boxes, image_size)`: float32 `(batch, cells, C)` grid
        features, float32 `(batch, cells, 4)` pixel boxes and the input image
        `(height, width)`, the arguments of `region_inputs`.

    Raises:
        ValueError: for images of the wrong shape, a bad `batch_size`, or a
            backbone whose output is not one of the two kinds above.

    Example:

    >>> import keras, numpy as np
    >>> inputs = keras.Input((16, 16, 3))
    >>> cnn = keras.Model(inputs, keras.layers.Conv2D(4, 3, strides=4, padding="same")(inputs))
    >>> features, boxes, image_size = image_grid_regions(cnn, np.zeros((2, 16, 16, 3), "float32"))
    >>> features.shape, boxes.shape, image_size
    ((2, 16, 4), (2, 16, 4), (16, 16))
    >>> boxes[0, :2]
    array([[0., 0., 4., 4.],
           [4., 0., 8., 4.]], dtype=float32)
    >>> from attention_zoo_keras.models.vilbert.vilbert_region_inputs import region_inputs
    >>> region_inputs(features, boxes, image_size, max_regions=17)["region_mask"].sum(axis=1)
    array([17, 17])
    """
    from attention_zoo_keras.models.vit.vit_backbone import ViTBackbone

    if batch_size is not None and (
        not isinstance(batch_size, numbers.Integral) or isinstance(batch_size, bool) or batch_size < 1
    ):
        raise ValueError(f"batch_size must be a positive int or None; got {batch_size!r}.")
    images = np.asarray(images)
    if images.ndim != 4:
        raise ValueError(
            f"images must be a numpy batch (batch, height, width, channels); got shape {images.shape}."
        )
    if images.shape[0] == 0:
        raise ValueError("images hold no image; give at least one.")
    batch = images.shape[0]

    if isinstance(image_backbone, ViTBackbone):
        sequence = _run_in_batches(image_backbone, {"images": images}, batch_size)["sequence_output"]
        grid_height, grid_width = image_backbone.grid_size
        patch_height, patch_width = image_backbone.patch_size
        features = sequence[:, 1:, :]
        # The patches cover the image's top-left grid * patch pixels
        # (PatchEmbedding drops pixels past the last whole patch).
        cells = grid_boxes(grid_height, grid_width, (grid_height * patch_height, grid_width * patch_width))
        image_size = tuple(int(size) for size in image_backbone.image_size)
    elif isinstance(image_backbone, keras.Model):
        model_inputs = getattr(image_backbone, "inputs", None)
        input_shape = None
        if model_inputs is not None:
            if len(model_inputs) != 1:
                raise ValueError(
                    f"image_grid_regions takes a model with one image input; {image_backbone.name} has "
                    f"{len(model_inputs)} inputs."
                )
            input_shape = tuple(model_inputs[0].shape)
            if len(input_shape) != 4:
                raise ValueError(
                    f"image_grid_regions takes a model whose input is a channels-last image batch "
                    f"(batch, height, width, channels); {image_backbone.name} takes {input_shape}."
                )
            expected = input_shape[1:]
            if any(want is not None and want != got for want, got in zip(expected, images.shape[1:])):
                raise ValueError(
                    f"images of shape {images.shape} do not fit {image_backbone.name}, which takes "
                    f"(batch, height, width, channels) = {input_shape}; resize them first."
                )
        output = _run_in_batches(image_backbone, images, batch_size)
        if isinstance(output, (list, tuple)) and len(output) == 1:
            output = output[0]
        if isinstance(output, dict) or isinstance(output, (list, tuple)) or np.ndim(output) != 4:
            described = (
                f"a dict with the keys {sorted(output)}" if isinstance(output, dict)
                else f"{len(output)} outputs" if isinstance(output, (list, tuple))
                else f"an output of shape {np.shape(output)}"
            )
            raise ValueError(
                f"image_grid_regions takes a ViTBackbone or a model whose output is one channels-last "
                f"feature map (batch, H', W', C), e.g. a keras.applications CNN with include_top=False; "
                f"{image_backbone.name} gives {described}."
            )
        grid_height, grid_width, channels = output.shape[1:]
        features = output.reshape(batch, grid_height * grid_width, channels)
        height = input_shape[1] if input_shape is not None and input_shape[1] is not None else images.shape[1]
        width = input_shape[2] if input_shape is not None and input_shape[2] is not None else images.shape[2]
        image_size = (int(height), int(width))
        cells = grid_boxes(int(grid_height), int(grid_width), image_size)
    else:
        raise ValueError(
            "image_backbone must be a ViTBackbone or a keras.Model whose output is a channels-last "
            f"feature map (batch, H', W', C); got {type(image_backbone).__name__}."
        )
    boxes = np.broadcast_to(cells, (batch, *cells.shape)).copy()
    return features.astype("float32"), boxes, image_size
