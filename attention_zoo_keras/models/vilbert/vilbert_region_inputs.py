"""Region inputs of ViLBERT (Lu et al., 2019, "ViLBERT: Pretraining
Task-Agnostic Visiolinguistic Representations for Vision-and-Language
Tasks"): from an image's detected boxes and their features to the
`region_features`, `region_boxes` and `region_mask` of `ViLBERTBackbone`,
as the authors' data loaders build them (facebookresearch/vilbert-multi-task,
`vilbert/datasets/_image_features_reader.py` and `concept_cap_dataset.py`).

A detector gives, per image of width w and height h, n boxes in pixels
`(x1, y1, x2, y2)` and n feature vectors (2048-d for the authors' Faster
R-CNN). The model sees each box as five numbers:

    loc = (x1 / w, y1 / h, x2 / w, y2 / h, (y2 - y1)(x2 - x1) / (w h))

Region 0 is a global image region prepended by the loader:

    feature_0 = (1 / n) Σ_i feature_i        (zeros when n = 0)
    loc_0     = (0, 0, 1, 1, 1)

The n + 1 regions are padded with zeros up to `max_regions` (the authors'
`max_region_num`: 101 for VQA, RefCOCO and retrieval, i.e. 100 boxes plus
the global one — the global region counts), and the region mask is 1 on the
real regions (the global one included) and 0 on the padding.

`grid_boxes` gives the boxes of a regular grid, for regions that are the
cells of an image backbone's feature grid
(`vilbert_grid_regions.image_grid_regions`).
"""

import numbers

import numpy as np

from attention_zoo_keras.models.preprocessor import first_non_finite

BOX_COORDINATES = 4
GLOBAL_BOX = (0.0, 0.0, 1.0, 1.0, 1.0)


def _per_image(values, name, width_name):
    """A list of 2-D per-image float64 arrays from a list of `(n_i, k)`
    arrays or one `(batch, n, k)` array."""
    if isinstance(values, (list, tuple)):
        images = [np.asarray(value) for value in values]
        for index, image in enumerate(images):
            if image.ndim != 2:
                raise ValueError(
                    f"{name}[{index}] must be 2-D, (regions, {width_name}); got shape {image.shape}. "
                    f"Pass {name} as a list of per-image (regions, {width_name}) arrays or as one "
                    f"(batch, regions, {width_name}) array."
                )
    else:
        array = np.asarray(values)
        if array.ndim != 3:
            raise ValueError(
                f"{name} must be one (batch, regions, {width_name}) array or a list of per-image "
                f"(regions, {width_name}) arrays; got an array of shape {array.shape}."
            )
        images = list(array)
    for index, image in enumerate(images):
        if not (np.issubdtype(image.dtype, np.number) or image.dtype == bool) or np.iscomplexobj(image):
            raise ValueError(f"{name}[{index}] must hold real numbers; got dtype {image.dtype}.")
    return [image.astype("float64") for image in images]


def _image_sizes(image_size, batch):
    """One `(height, width)` float64 pair per image, checked positive and finite."""
    try:
        sizes = np.asarray(image_size, dtype="float64")
    except (TypeError, ValueError):
        sizes = np.zeros((0,))
    if sizes.ndim == 1 and sizes.shape[0] == 2:
        sizes = np.tile(sizes, (batch, 1))
    elif sizes.ndim == 2 and sizes.shape[1] == 2:
        if sizes.shape[0] != batch:
            raise ValueError(
                f"image_size gives {sizes.shape[0]} (height, width) pairs but there are {batch} images "
                "(the batch size of features and boxes); give one pair per image, or one pair for all."
            )
    else:
        raise ValueError(
            "image_size must be one (height, width) pair for every image or a list of per-image "
            f"(height, width) pairs; got {image_size!r}."
        )
    for index, (height, width) in enumerate(sizes):
        if not (np.isfinite(height) and np.isfinite(width) and height > 0 and width > 0):
            raise ValueError(
                f"image_size of image {index} must be a positive (height, width); got "
                f"({height:g}, {width:g})."
            )
    return sizes


def region_inputs(features, boxes, image_size, max_regions=101):
    """ViLBERT's region inputs from per-image detector boxes and features.

    Each image's boxes become `(x1/w, y1/h, x2/w, y2/h, (y2-y1)(x2-x1)/(wh))`;
    a global region (the mean feature, box `(0, 0, 1, 1, 1)`) is prepended as
    region 0; everything is zero-padded to `max_regions` with a 0/1 mask.

    Args:
        features: list of arrays, or array. The region features, a list of
            per-image `(n_i, D)` arrays (images may hold different numbers of
            regions, even none), or one `(batch, n, D)` array.
        boxes: list of arrays, or array. The matching pixel boxes
            `(x1, y1, x2, y2)`, a list of per-image `(n_i, 4)` arrays or one
            `(batch, n, 4)` array. Each box must satisfy
            `0 <= x1 <= x2 <= w` and `0 <= y1 <= y2 <= h`.
        image_size: tuple of int, or list of them. The images'
            `(height, width)` in pixels, one pair for all images or a list of
            one pair per image.
        max_regions: int. The regions per image in the output, the global
            region included (the authors' `max_region_num`, 101 = 100 boxes
            + 1).

    Returns:
        A dict of numpy arrays: `region_features` `(batch, max_regions, D)`
        float32, `region_boxes` `(batch, max_regions, 5)` float32,
        `region_mask` `(batch, max_regions)` int32 — the `ViLBERTBackbone`
        inputs of the same names.

    Raises:
        ValueError: for inputs of the wrong shape or kind, a box outside its
            image, non-finite features or boxes, or more regions than fit.

    Example:

    >>> import numpy as np
    >>> features = [np.array([[1.0, 2.0], [3.0, 6.0]])]
    >>> boxes = [np.array([[0, 0, 50, 25], [10, 20, 100, 100]])]
    >>> out = region_inputs(features, boxes, image_size=(100, 200), max_regions=4)
    >>> out["region_features"][0]
    array([[2., 4.],
           [1., 2.],
           [3., 6.],
           [0., 0.]], dtype=float32)
    >>> out["region_boxes"][0].round(4)
    array([[0.    , 0.    , 1.    , 1.    , 1.    ],
           [0.    , 0.    , 0.25  , 0.25  , 0.0625],
           [0.05  , 0.2   , 0.5   , 1.    , 0.36  ],
           [0.    , 0.    , 0.    , 0.    , 0.    ]], dtype=float32)
    >>> out["region_mask"]
    array([[1, 1, 1, 0]], dtype=int32)
    """
    if not isinstance(max_regions, numbers.Integral) or isinstance(max_regions, bool) or max_regions < 1:
        raise ValueError(
            f"max_regions must be a positive int (the global image region takes one slot); got {max_regions!r}."
        )
    features = _per_image(features, "features", "feature_dim")
    boxes = _per_image(boxes, "boxes", "4")
    if len(features) != len(boxes):
        raise ValueError(
            f"features hold {len(features)} images but boxes hold {len(boxes)}; give one entry per image in both."
        )
    batch = len(features)
    if batch == 0:
        raise ValueError("features and boxes hold no images; give at least one.")
    sizes = _image_sizes(image_size, batch)

    widths = [image.shape[1] for image in features]
    if len(set(widths)) > 1:
        raise ValueError(
            "Every image's features must have the same width (feature_dim); got the widths "
            f"{widths} for images 0..{batch - 1}."
        )
    feature_dim = widths[0]

    for index, (image_features, image_boxes) in enumerate(zip(features, boxes)):
        if image_boxes.shape[1] != BOX_COORDINATES:
            raise ValueError(
                f"boxes of image {index} must be (regions, 4), pixel (x1, y1, x2, y2) each; got shape "
                f"{image_boxes.shape}."
            )
        if image_features.shape[0] != image_boxes.shape[0]:
            raise ValueError(
                f"image {index} has {image_features.shape[0]} feature vectors but {image_boxes.shape[0]} boxes; "
                "features and boxes must give one row per region."
            )
        count = image_features.shape[0]
        if count + 1 > max_regions:
            raise ValueError(
                f"image {index} has {count} regions, but with the global image region that is {count + 1} "
                f"regions and max_regions is {max_regions}: the global region takes one of the max_regions "
                f"slots, so at most {max_regions - 1} boxes fit. Keep the detector's top {max_regions - 1} "
                f"boxes, or raise max_regions to {count + 1}."
            )
        bad = first_non_finite(image_features)
        if bad is not None:
            raise ValueError(
                f"features of image {index} are not all finite (NaN or inf); the first is in region {bad[0]}."
            )
        bad = first_non_finite(image_boxes)
        if bad is not None:
            raise ValueError(
                f"boxes of image {index} are not all finite; box {bad[0]} is {image_boxes[bad[0]].tolist()}."
            )
        height, width = sizes[index]
        x1, y1, x2, y2 = image_boxes.T
        inside = (0 <= x1) & (x1 <= x2) & (x2 <= width) & (0 <= y1) & (y1 <= y2) & (y2 <= height)
        if not np.all(inside):
            bad = int(np.argmin(inside))
            raise ValueError(
                f"box {bad} of image {index}, (x1, y1, x2, y2) = {image_boxes[bad].tolist()}, is not inside "
                f"its image of (height, width) = ({height:g}, {width:g}): a box must satisfy "
                "0 <= x1 <= x2 <= width and 0 <= y1 <= y2 <= height, in pixels."
            )

    region_features = np.zeros((batch, max_regions, feature_dim), dtype="float32")
    region_boxes = np.zeros((batch, max_regions, BOX_COORDINATES + 1), dtype="float32")
    region_mask = np.zeros((batch, max_regions), dtype="int32")
    for index, (image_features, image_boxes) in enumerate(zip(features, boxes)):
        count = image_features.shape[0]
        height, width = sizes[index]
        x1, y1, x2, y2 = image_boxes.T
        locations = np.stack(
            [x1 / width, y1 / height, x2 / width, y2 / height, (y2 - y1) * (x2 - x1) / (width * height)],
            axis=-1,
        )
        if count:
            region_features[index, 0] = image_features.mean(axis=0)
        region_features[index, 1 : count + 1] = image_features
        region_boxes[index, 0] = GLOBAL_BOX
        region_boxes[index, 1 : count + 1] = locations
        region_mask[index, : count + 1] = 1
    return {"region_features": region_features, "region_boxes": region_boxes, "region_mask": region_mask}


def grid_boxes(grid_height, grid_width, image_size):
    """Pixel boxes of a regular `grid_height` × `grid_width` grid over an image.

    Cell `(i, j)` (row i, column j) is `(j w / gw, i h / gh, (j+1) w / gw,
    (i+1) h / gh)`; the cells are listed row-major, as a feature map or a
    ViT's patches are flattened.

    Args:
        grid_height: int. The rows of the grid, positive.
        grid_width: int. The columns of the grid, positive.
        image_size: tuple of int. The image's `(height, width)` in pixels.

    Returns:
        A float32 numpy array `(grid_height * grid_width, 4)` of
        `(x1, y1, x2, y2)`.

    Example:

    >>> grid_boxes(2, 3, image_size=(20, 30))
    array([[ 0.,  0., 10., 10.],
           [10.,  0., 20., 10.],
           [20.,  0., 30., 10.],
           [ 0., 10., 10., 20.],
           [10., 10., 20., 20.],
           [20., 10., 30., 20.]], dtype=float32)
    """
    for name, value in (("grid_height", grid_height), ("grid_width", grid_width)):
        if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive int; got {value!r}.")
    height, width = _image_sizes(image_size, 1)[0]
    rows, columns = np.meshgrid(np.arange(grid_height), np.arange(grid_width), indexing="ij")
    rows, columns = rows.reshape(-1), columns.reshape(-1)
    boxes = np.stack(
        [
            columns * width / grid_width,
            rows * height / grid_height,
            (columns + 1) * width / grid_width,
            (rows + 1) * height / grid_height,
        ],
        axis=-1,
    )
    return boxes.astype("float32")
