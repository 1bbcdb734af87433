"""Convert a `transformers` BERT checkpoint into a native attention_zoo_keras
preset, verify it against `transformers`, and optionally publish it.

Unlike loading at run time (safetensors only), this script also reads a
PyTorch `pytorch_model.bin`, strictly with `torch.load(weights_only=True)`,
which refuses to unpickle anything but tensors.

    python conversion/convert_bert.py SRC DEST [--task masked_lm] [--no-verify]

SRC is a local directory or `hf://org/repo[@revision]` in `transformers`
format; DEST receives the native preset.
"""

import argparse
import sys

import numpy as np

import attention_zoo_keras as azk
from attention_zoo_keras.hub.source import PresetSource
from state_dict import convert

TASKS = {
    "backbone": azk.models.BertBackbone,
    "masked_lm": azk.models.BertMaskedLM,
    "classifier": azk.models.BertTextClassifier,
    "embedder": azk.models.BertTextEmbedder,
}
VERIFY_TEXTS = ["The attention mechanism relates every token to every other.", "A short one."]
TOLERANCE = 1e-4


def verify(model, src):
    """Max |ours − transformers| of the last hidden state on a few sentences."""
    import torch
    import transformers

    source = PresetSource.of(src)
    directory = source.require("config.json").parent
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    reference = transformers.BertModel.from_pretrained(directory).eval()
    encoded = tokenizer(VERIFY_TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        expected = reference(**encoded).last_hidden_state.numpy()
    backbone = getattr(model, "backbone", model)
    ours = backbone(
        {
            "token_ids": encoded["input_ids"].numpy().astype("int32"),
            "segment_ids": encoded["token_type_ids"].numpy().astype("int32"),
            "padding_mask": encoded["attention_mask"].numpy().astype("int32"),
        }
    )["sequence_output"]
    import keras

    return float(np.max(np.abs(keras.ops.convert_to_numpy(ours) - expected)))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src")
    parser.add_argument("dest")
    parser.add_argument("--task", choices=sorted(TASKS), default="backbone")
    parser.add_argument("--no-verify", action="store_true", help="skip the comparison with transformers")
    args = parser.parse_args(argv)
    model = convert(TASKS[args.task], args.src)
    if not args.no_verify:
        difference = verify(model, args.src)
        print(f"max |ours - transformers| on the last hidden state: {difference:.2e}")
        if difference > TOLERANCE:
            print(f"FAILED: above the tolerance {TOLERANCE}; nothing saved.", file=sys.stderr)
            return 1
    model.save_to_preset(args.dest)
    print(f"saved {type(model).__name__} to {args.dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
