"""Times a ViT image classifier: ours against KerasHub's (and, on torch,
Hugging Face transformers', eager and under ``torch.compile``) in one
process, on the same images, for inference and for one training step.

The Keras backend is the one KERAS_BACKEND names; ``bash benchmarks/run.sh
vit`` runs all three. Weights are random: nothing is downloaded.

Sizes (``--size``; every contender built alike, dropout 0):

* ``base``: ViT-B/16 at 224 × 224 (12 layers, 12 heads, 768 wide, MLP
  3072; 197 tokens), the shape of ``google/vit-base-patch16-224``;
* ``small`` (the default): a CIFAR-sized ViT, 32 × 32 images in 4 × 4
  patches (65 tokens), 6 layers, 4 heads, 256 wide, MLP 512, where
  per-operation dispatch weighs as much as arithmetic on a CPU;
* ``tiny``: a seconds-long smoke test of the script itself.

Contenders:

* ``ours``: ``attention_zoo_keras.models.ViTImageClassifier`` (no
  preprocessor), with its ``FusedAdam``;
* ``keras_hub``: ``keras_hub.models.ViTImageClassifier`` (no
  preprocessor), with ``keras.optimizers.Adam``;
* ``transformers`` (torch only): ``ViTForImageClassification`` with sdpa
  attention, ``torch.optim.Adam`` (on CUDA ``AdamW(fused=True,
  weight_decay=0)``);
* ``transformers_compiled`` (torch only, inference): the same forward under
  ``torch.compile``.

Inference: the Keras models' ``predict_on_batch(images)`` (numpy logits
back; on torch ours replays its recorded step), transformers' eval-mode
forward under ``torch.no_grad()`` with the logits converted by the same
``keras.ops.convert_to_numpy``. Training: ``train_on_batch(images,
labels)`` after ``compile`` (sparse categorical cross-entropy on logits,
learning rate 1e-4) against transformers' forward, backward and optimizer
step, its loss returned as a float. The Keras models take channels-last
float32 numpy images (on torch, tensors already on the device),
transformers the same values channels-first. The first call (compilation,
recording) is timed alone; the others run in interleaved rounds
(``benchmarks.contenders.time_rounds``), and the table gives the medians,
minima and ratios other / ours (above 1: ours faster).

Example::

    KERAS_BACKEND=torch python -m benchmarks.vit_benchmark --size small --batch-size 32 --rounds 20
    bash benchmarks/run.sh vit --size base --batch-size 8 --rounds 7
"""

import argparse

from benchmarks.contenders import RATIO_NOTE
from benchmarks.contenders import ratio_cells
from benchmarks.contenders import select_contenders
from benchmarks.contenders import time_rounds
from benchmarks.contenders import timed_call
from benchmarks.contenders import transformers_optimizer
from benchmarks.timing import cpu_line
from benchmarks.timing import device_description
from benchmarks.timing import device_synchronizer
from benchmarks.timing import fmt_ms
from benchmarks.timing import fmt_versions
from benchmarks.timing import load_line
from benchmarks.timing import start_backend
from benchmarks.timing import versions
from benchmarks.timing import write_json

SIZES = {
    "base": dict(image_size=224, patch_size=16, num_layers=12, num_heads=12, hidden_dim=768, intermediate_dim=3072),
    "small": dict(image_size=32, patch_size=4, num_layers=6, num_heads=4, hidden_dim=256, intermediate_dim=512),
    "tiny": dict(image_size=16, patch_size=8, num_layers=1, num_heads=2, hidden_dim=16, intermediate_dim=32),
}
CONTENDERS = ("ours", "keras_hub", "transformers", "transformers_compiled")
TORCH_ONLY = ("transformers", "transformers_compiled")
NUM_CLASSES = 10
LEARNING_RATE = 1e-4


def make_data(config, batch_size, backend, device):
    """`(numpy images, numpy labels, keras images, keras labels)`: the same
    random channels-last float32 images and int32 labels, the Keras copies
    as tensors on `device` under torch."""
    import numpy as np

    rng = np.random.default_rng(0)
    size = config["image_size"]
    images = rng.random((batch_size, size, size, 3), dtype="float32")
    labels = rng.integers(0, NUM_CLASSES, batch_size).astype("int32")
    if backend != "torch":
        return images, labels, images, labels
    import torch

    return images, labels, torch.from_numpy(images).to(device), torch.from_numpy(labels).to(device)


def keras_model(name, config):
    """`(classifier, optimizer)` of the Keras contender `name`."""
    import keras

    if name == "keras_hub":
        import keras_hub

        backbone = keras_hub.models.ViTBackbone(
            image_shape=(config["image_size"], config["image_size"], 3), patch_size=config["patch_size"],
            num_layers=config["num_layers"], num_heads=config["num_heads"], hidden_dim=config["hidden_dim"],
            mlp_dim=config["intermediate_dim"],
        )
        model = keras_hub.models.ViTImageClassifier(backbone=backbone, num_classes=NUM_CLASSES, preprocessor=None)
        return model, keras.optimizers.Adam(LEARNING_RATE)
    from attention_zoo_keras.models import ViTBackbone
    from attention_zoo_keras.models import ViTImageClassifier
    from attention_zoo_keras.optimizers import FusedAdam

    model = ViTImageClassifier(ViTBackbone(**config), num_classes=NUM_CLASSES)
    return model, FusedAdam(LEARNING_RATE)


def keras_step(name, mode, config, images, labels):
    """`(step, description)` of a Keras contender in `mode`."""
    import keras

    model, optimizer = keras_model(name, config)
    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    if mode == "training":
        return (lambda: model.train_on_batch(images, labels)), f"train_on_batch with {type(optimizer).__name__}"
    return (lambda: model.predict_on_batch(images)), "predict_on_batch"


def transformers_step(name, mode, config, images, labels, device):
    """`(step, description)` of `transformers`' `ViTForImageClassification` in `mode`."""
    import keras
    import torch
    import transformers

    hf_config = transformers.ViTConfig(
        image_size=config["image_size"], patch_size=config["patch_size"], num_hidden_layers=config["num_layers"],
        num_attention_heads=config["num_heads"], hidden_size=config["hidden_dim"],
        intermediate_size=config["intermediate_dim"], num_labels=NUM_CLASSES, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    hf_config._attn_implementation = "sdpa"
    model = transformers.ViTForImageClassification(hf_config).to(device)
    pixels = torch.from_numpy(images).permute(0, 3, 1, 2).contiguous().to(device)
    if mode == "inference":
        model.eval()
        forward = torch.compile(model.forward) if name == "transformers_compiled" else model.forward

        def infer():
            with torch.no_grad():
                return keras.ops.convert_to_numpy(forward(pixel_values=pixels).logits)

        compiled = "torch.compile(model.forward), " if name == "transformers_compiled" else ""
        return infer, f"{compiled}eval + torch.no_grad() (sdpa), logits to numpy"
    model.train()
    optimizer, optimizer_name = transformers_optimizer(model.parameters(), LEARNING_RATE, device)
    targets = torch.from_numpy(labels).long().to(device)

    def train():
        optimizer.zero_grad(set_to_none=True)
        loss = model(pixel_values=pixels, labels=targets).loss
        loss.backward()
        optimizer.step()
        return float(loss.detach())

    return train, f"forward, backward, {optimizer_name} step (sdpa)"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=15, help="timed calls per contender and mode")
    parser.add_argument("--modes", default="inference,training")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="auto", help="torch only: auto, cpu or cuda")
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    parser.add_argument("--backend-label", default=None, help="a name for the backend in the output")
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = parser.parse_args(argv)

    backend, device = start_backend(args.threads, args.device)
    import keras

    names = select_contenders(args.contenders, CONTENDERS)
    if backend != "torch":
        names = [name for name in names if name not in TORCH_ONLY]
    modes = [mode.strip() for mode in args.modes.split(",") if mode.strip()]
    config = SIZES[args.size]
    synchronize = device_synchronizer(backend, device)
    images, labels, keras_images, keras_labels = make_data(config, args.batch_size, backend, device)
    tokens = (config["image_size"] // config["patch_size"]) ** 2 + 1
    print(f"# ViT ({args.size}: {config}; {tokens} tokens), batch {args.batch_size}, float32, "
          f"backend {args.backend_label or backend}")
    print(f"device: {device_description(backend, device)}")
    print(cpu_line(args.threads, per_library=True))
    print(fmt_versions(versions(backend)))
    results = {}
    for mode in modes:
        steps = {}
        for name in names:
            if mode == "training" and name == "transformers_compiled":
                continue  # inference only
            keras.utils.set_random_seed(0)
            if name in TORCH_ONLY:
                step, path = transformers_step(name, mode, config, images, labels, device)
            else:
                step, path = keras_step(name, mode, config, keras_images, keras_labels)
            _, first, _ = timed_call(step, synchronize)
            for _ in range(2):
                step()
            steps[name] = lambda step=step: (step(), synchronize())
            results.setdefault(name, {})[mode] = {"path": path, "first_call_s": first}
            print(f"[{name}] {mode}: {path}; first call {first:.2f} s")
        print(load_line(f"{mode} start"))
        entries = time_rounds(steps, args.rounds)
        print(load_line(f"{mode} end"))
        for name, entry in entries.items():
            results[name][mode].update(entry)

    print("\n| contender | mode | first call s | median ms | min ms | CPU ms | ratio (median) | ratio (min) | "
          "ratio (paired) |\n|---|---|---|---|---|---|---|---|---|")
    for name, by_mode in results.items():
        for mode, entry in by_mode.items():
            ratios = ratio_cells(entry, results.get("ours", {}).get(mode)) if name != "ours" else ["", "", ""]
            times = [fmt_ms(entry[key]).strip() for key in ("median_s", "min_s", "cpu_median_s")]
            print(f"| {name} | {mode} | {entry['first_call_s']:.2f} | " + " | ".join(times + ratios) + " |")
    print(RATIO_NOTE + ").")
    if args.json:
        write_json(args.json, {"backend": backend, "device": device_description(backend, device), "args": vars(args),
                               "config": config, "results": results})


if __name__ == "__main__":
    main()
