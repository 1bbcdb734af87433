"""Trains a small ViT on scikit-learn's handwritten digits, then fine-tunes
it at a higher resolution.

The data set (1,797 8x8 grey images of the digits 0-9, from UCI) ships inside
scikit-learn, so nothing is downloaded. Two stages:

1. Train a 4-layer ViT from scratch at 16x16 (the 8x8 images upsampled by the
   image converter, 4x4 patches, a 4x4 patch grid) and save it as a preset.
2. Load that preset at 24x24 (`image_size=24`): the learned 4x4 grid of
   position embeddings is interpolated to 6x6 (bicubic, class token kept),
   the converter resizes to the new size, and the model is fine-tuned there.

Run: `KERAS_BACKEND=jax python examples/vit_digits/train.py` (any backend).
Results are in this folder's README.
"""

import argparse
import tempfile
import time

import keras
import numpy as np
from sklearn.datasets import load_digits

import attention_zoo_keras as azk


def digits_split(seed):
    digits = load_digits()
    images = (digits.images * (255 / 16)).round().astype("uint8")[..., None]  # (n, 8, 8, 1), 0-255
    order = np.random.default_rng(seed).permutation(len(images))
    cut = int(0.8 * len(images))
    train, test = order[:cut], order[cut:]
    return (list(images[train]), digits.target[train]), (list(images[test]), digits.target[test])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=15, help="epochs at 16x16")
    parser.add_argument("--fine-tune-epochs", type=int, default=3, help="epochs at 24x24")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    keras.utils.set_random_seed(args.seed)
    (train_x, train_y), (test_x, test_y) = digits_split(args.seed)
    print(f"backend {keras.backend.backend()}: {len(train_x)} training and {len(test_x)} test images")

    backbone = azk.models.ViTBackbone(
        image_size=16, patch_size=4, num_channels=1, num_layers=4, num_heads=4, hidden_dim=64,
        intermediate_dim=128, dropout=0.1,
    )
    converter = azk.models.ViTImageConverter(image_size=16, num_channels=1, image_mean=0.5, image_std=0.5)
    classifier = azk.models.ViTImageClassifier(
        backbone, num_classes=10, preprocessor=converter, class_names=[str(d) for d in range(10)]
    )
    classifier.compile(optimizer=keras.optimizers.AdamW(2e-3, weight_decay=0.05))
    start = time.perf_counter()
    classifier.fit(train_x, train_y, batch_size=32, epochs=args.epochs, verbose=2)
    accuracy_16 = classifier.evaluate(test_x, test_y, verbose=0, return_dict=True)["accuracy"]
    print(f"16x16: test accuracy {accuracy_16:.3f} after {args.epochs} epochs ({time.perf_counter() - start:.0f} s)")

    with tempfile.TemporaryDirectory() as directory:
        classifier.save_to_preset(directory)
        fine_tuned = azk.models.ViTImageClassifier.from_preset(directory, image_size=24)
    print(f"reloaded at 24x24: position grid {fine_tuned.backbone.grid_size}")
    accuracy_before = fine_tuned.evaluate(test_x, test_y, verbose=0, return_dict=True)["accuracy"]
    fine_tuned.compile(optimizer=keras.optimizers.AdamW(5e-4, weight_decay=0.05))
    fine_tuned.fit(train_x, train_y, batch_size=32, epochs=args.fine_tune_epochs, verbose=2)
    accuracy_24 = fine_tuned.evaluate(test_x, test_y, verbose=0, return_dict=True)["accuracy"]
    print(f"24x24: test accuracy {accuracy_before:.3f} before fine-tuning, {accuracy_24:.3f} after "
          f"{args.fine_tune_epochs} epochs")
    for label, guesses in zip(test_y[:3], fine_tuned.predict(test_x[:3], top_k=3, verbose=0)):
        print(f"  digit {label}: " + ", ".join(f"{name} ({p:.2f})" for name, p in guesses))


if __name__ == "__main__":
    main()
