"""Convert a `transformers` Reformer checkpoint (`ReformerModelWithLMHead`,
e.g. `hf://google/reformer-crime-and-punishment`) into a native
attention_zoo_keras preset, and verify it against `transformers`.

Unlike loading at run time (safetensors only), this also reads a PyTorch
`pytorch_model.bin`, strictly with `torch.load(weights_only=True)`.

    python conversion/convert_reformer.py SRC DEST [--no-verify] [--verify-length N]

SRC is a local directory or `hf://org/repo[@revision]` in `transformers`
format; DEST receives the native preset. Verification runs both models on
random ids with the same LSH rotations (transformers' draw for a fixed
`hash_seed`, handed to ours: `ReformerAttention.rotations`) and compares
the logits; transformers 5.x leaves out `lm_head.bias`, so the comparison
adds it to theirs.
"""

import argparse
import sys

import numpy as np

from attention_zoo_keras.attention.lsh import lsh_rotations_shape
from attention_zoo_keras.hub.source import PresetSource
from attention_zoo_keras.models.reformer import ReformerCausalLM
from state_dict import convert

VERIFY_SEED = 1234
TOLERANCE = 1e-4


def verify(model, src, length):
    """Max |ours − transformers| of the logits of two random sequences."""
    import keras
    import torch
    import transformers

    directory = PresetSource.of(src).require("config.json").parent
    reference = transformers.ReformerModelWithLMHead.from_pretrained(directory).eval()
    for module in reference.modules():
        if hasattr(module, "hash_seed"):
            module.hash_seed = VERIFY_SEED
    backbone = model.backbone
    if "lsh" in backbone.attention_layers:
        torch.manual_seed(VERIFY_SEED)
        shape = lsh_rotations_shape(backbone.num_heads, backbone.head_dim, backbone.num_hashes, backbone.num_buckets)
        rotations = torch.randn(shape).numpy()
        for branch in backbone.attention_branches:
            if branch.attention == "lsh":
                branch.rotations = rotations
    ids = np.random.default_rng(0).integers(0, backbone.vocabulary_size, size=(2, length))
    with torch.no_grad():
        expected = reference(torch.tensor(ids)).logits.numpy() + reference.lm_head.bias.numpy()
    ours = keras.ops.convert_to_numpy(model({"token_ids": ids, "padding_mask": np.ones_like(ids)}))
    for branch in backbone.attention_branches:
        branch.rotations = None
    return float(np.max(np.abs(ours - expected)))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src")
    parser.add_argument("dest")
    parser.add_argument("--no-verify", action="store_true", help="skip the comparison with transformers")
    parser.add_argument("--verify-length", type=int, default=256, help="tokens per verification sequence")
    args = parser.parse_args(argv)
    model = convert(ReformerCausalLM, args.src)
    if not args.no_verify:
        difference = verify(model, args.src, args.verify_length)
        print(f"max |ours - transformers| on the logits: {difference:.2e}")
        if difference > TOLERANCE:
            print(f"FAILED: above the tolerance {TOLERANCE}; nothing saved.", file=sys.stderr)
            return 1
    model.save_to_preset(args.dest)
    print(f"saved {type(model).__name__} to {args.dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
