"""Images in, ViT pixel inputs out: resize, rescale, normalise.

    x' = (resize(x) · rescale_factor − image_mean) / image_std      (per channel)

(each step can be switched off: `do_resize`, `do_rescale`, `do_normalize`).

Images are channels-last arrays of any size — uint8, or floats on the same
0–255 scale — or PIL images. Resizing is Pillow's bilinear filter (with its
antialiasing when shrinking), the filter `transformers`' ViT image processor
uses, so uint8 images give exactly its pixel values. Float images are
resized per channel in Pillow's 32-bit float mode (no rounding to uint8,
unlike `transformers`, which quantises them first). It runs on the host, per
image, before batching: images of different sizes can share a batch.
"""

import numpy as np
from PIL import Image

from attention_zoo_keras.models.preprocessor import Preprocessor
from attention_zoo_keras.models.preprocessor import first_non_finite
from attention_zoo_keras.registration import register

_RESAMPLING = {name: getattr(Image.Resampling, name.upper()) for name in (
    "nearest", "bilinear", "bicubic", "lanczos", "box", "hamming"
)}


def _pair(size):
    return (int(size), int(size)) if np.isscalar(size) else (int(size[0]), int(size[1]))


# Array kinds taken as images: unsigned and signed integers, floats; booleans
# too, so that a boolean array gets the converter's error naming its dtype.
_IMAGE_KINDS = "buif"


def _is_image(x):
    if isinstance(x, Image.Image):
        return True
    return isinstance(x, np.ndarray) and x.ndim in (2, 3) and x.dtype.kind in _IMAGE_KINDS


@register
class ViTImageConverter(Preprocessor):
    """Resizes, rescales and normalises images for a `ViTBackbone`.

    Args:
        image_size: int or tuple of int. The `(height, width)` (or one int)
            the model takes.
        do_resize: bool. Resize images to `image_size` (without it, images
            must already have that size).
        resample: str. Pillow's filter: `"bilinear"` (ViT's), `"bicubic"`,
            `"nearest"`, `"lanczos"`, `"box"` or `"hamming"`.
        do_rescale: bool. Multiply the 0–255 pixel values by
            `rescale_factor`.
        rescale_factor: float. The scale of the pixel values; 1/255 maps
            pixels into [0, 1].
        do_normalize: bool. Subtract `image_mean` and divide by `image_std`.
        image_mean: float or tuple of float. The per-channel mean (one value
            or one per channel).
        image_std: float or tuple of float. The per-channel standard
            deviation.
        num_channels: int. The channels the model takes; grayscale images
            are repeated to 3 channels and an alpha channel is dropped.

    Called on images (one `(height, width, channels)` array, a batch
    `(batch, height, width, channels)`, or a list of arrays / PIL images of
    any sizes) it returns `{"images": float32 (batch, height, width,
    channels)}`; with labels, `(features, labels)`.

    Example:

    >>> import numpy as np
    >>> converter = ViTImageConverter(image_size=32)
    >>> batch = converter([np.zeros((40, 60, 3), "uint8"), np.full((20, 20, 3), 255, "uint8")])
    >>> batch["images"].shape, float(batch["images"][0].min()), float(batch["images"][1].max())
    ((2, 32, 32, 3), -1.0, 1.0)
    """

    family = "vit"

    def __init__(
        self,
        image_size=224,
        do_resize=True,
        resample="bilinear",
        do_rescale=True,
        rescale_factor=1 / 255,
        do_normalize=True,
        image_mean=(0.5, 0.5, 0.5),
        image_std=(0.5, 0.5, 0.5),
        num_channels=3,
    ):
        super().__init__(tokenizer=None)
        if resample not in _RESAMPLING:
            raise ValueError(f"resample must be one of {sorted(_RESAMPLING)}; got '{resample}'.")
        self.image_size = _pair(image_size)
        self.num_channels = int(num_channels)
        self.do_resize = bool(do_resize)
        self.resample = resample
        self.do_rescale = bool(do_rescale)
        self.rescale_factor = float(rescale_factor)
        self.do_normalize = bool(do_normalize)
        self.image_mean = self._per_channel("image_mean", image_mean)
        self.image_std = self._per_channel("image_std", image_std)
        if np.any(self.image_std <= 0):
            raise ValueError(f"image_std must be positive; got {self.image_std.tolist()}.")

    def _per_channel(self, name, values):
        values = np.ravel(np.asarray(values, "float32"))
        if values.size not in (1, self.num_channels):
            raise ValueError(f"{name} has {values.size} values for {self.num_channels} channels.")
        return np.broadcast_to(values, (self.num_channels,)).copy()

    # --- raw input --------------------------------------------------------

    def is_raw(self, x):
        if _is_image(x):
            return True
        if isinstance(x, np.ndarray):
            return x.ndim == 4 and x.dtype.kind in _IMAGE_KINDS
        return isinstance(x, (list, tuple)) and all(_is_image(image) for image in x)

    def images(self, x):
        """The input as a list of single images."""
        if not self.is_raw(x):
            raise TypeError(
                "ViTImageConverter takes an image (height, width, channels), a batch "
                "(batch, height, width, channels), or a list of images (arrays or PIL images); "
                f"got {type(x).__name__}{'' if not isinstance(x, np.ndarray) else f' of shape {x.shape}'}."
            )
        return list(self.as_batch(x))

    def count_examples(self, x):
        return len(self.images(x))

    def as_batch(self, x):
        """One image (an array or a PIL image) as a list of one; a batch or
        a list of images as it is."""
        return [x] if _is_image(x) else x

    # --- conversion -------------------------------------------------------

    def _channels(self, image, index):
        """`image` as a float32 or uint8 `(height, width, num_channels)`
        array; raises for an image without pixels or with NaN / inf values."""
        if isinstance(image, Image.Image):
            image = np.asarray(image.convert("RGB" if self.num_channels == 3 else "L"))
        image = np.asarray(image)
        if image.dtype.kind == "b":
            raise TypeError(
                f"Image {index} is an array of booleans; give pixel values: uint8 (0 to 255) or floats "
                "(scaled by rescale_factor like them), e.g. image.astype('uint8') * 255."
            )
        if image.size == 0:
            raise ValueError(f"Image {index} has shape {image.shape}: it holds no pixels.")
        bad = first_non_finite(image) if image.dtype.kind == "f" else None
        if bad is not None:
            raise ValueError(
                f"Image {index} holds {image[bad]} at (row, column{', channel' if len(bad) == 3 else ''}) = "
                f"{bad}; pixel values must be finite."
            )
        if image.ndim == 2:
            image = image[:, :, None]
        channels = image.shape[-1]
        if channels == 1 and self.num_channels == 3:
            image = np.repeat(image, 3, axis=-1)
        elif channels == 4 and self.num_channels == 3:
            image = image[:, :, :3]
        elif channels != self.num_channels:
            raise ValueError(
                f"Image {index} has shape {image.shape}: {channels} channels, but the model takes "
                f"{self.num_channels} (channels-last images are expected)."
            )
        if image.dtype != np.uint8:
            image = image.astype("float32")
        return image

    def _resize(self, image, index):
        height, width = self.image_size
        if image.shape[:2] == (height, width):
            return image.astype("float32")
        if not self.do_resize:
            raise ValueError(
                f"Image {index} is {image.shape[0]}x{image.shape[1]}, but the model takes "
                f"{height}x{width} images and do_resize is off."
            )
        resample = _RESAMPLING[self.resample]
        if image.dtype == np.uint8:
            pil = Image.fromarray(image if image.shape[-1] == 3 else image[:, :, 0])  # RGB or L
            resized = np.asarray(pil.resize((width, height), resample=resample))
            return resized.reshape(height, width, -1).astype("float32")
        planes = [  # mode F: 32-bit float planes
            np.asarray(Image.fromarray(image[:, :, c]).resize((width, height), resample=resample))
            for c in range(image.shape[-1])
        ]
        return np.stack(planes, axis=-1)

    def convert(self, x):
        """Float32 `(batch, height, width, channels)` model inputs."""
        self.num_examples(x)  # raises for None or no image
        images = np.stack(
            [self._resize(self._channels(image, index), index) for index, image in enumerate(self.images(x))]
        )
        if self.do_rescale:
            images = images * np.float32(self.rescale_factor)
        if self.do_normalize:
            images = (images - self.image_mean) / self.image_std
        return images

    def __call__(self, x, y=None, sample_weight=None):
        return self.with_labels({"images": self.convert(x).astype("float32")}, y, sample_weight)

    def get_config(self):
        return {
            "image_size": list(self.image_size),
            "do_resize": self.do_resize,
            "resample": self.resample,
            "do_rescale": self.do_rescale,
            "rescale_factor": self.rescale_factor,
            "do_normalize": self.do_normalize,
            "image_mean": self.image_mean.tolist(),
            "image_std": self.image_std.tolist(),
            "num_channels": self.num_channels,
        }
