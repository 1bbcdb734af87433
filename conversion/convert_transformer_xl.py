"""Convert a `transformers` Transformer-XL checkpoint (`TransfoXLLMHeadModel`,
e.g. `hf://transfo-xl/transfo-xl-wt103`) into a native attention_zoo_keras
preset: weights as safetensors, the vocabulary as `tokenizer.json`.

The Hub's files are pickles: `pytorch_model.bin` is read only with
`torch.load(weights_only=True)` (tensors and plain containers), the
vocabulary (`vocab.pkl`, or the legacy `torch.save` file `vocab.bin`) only
with a restricted unpickler that builds nothing but plain containers and
strings (`attention_zoo_keras.tokenizers.restricted_pickle`).

    python conversion/convert_transformer_xl.py SRC DEST

SRC is a local directory or `hf://org/repo[@revision]` in `transformers`
format; DEST receives the native preset. `transformers` 5.x no longer has
Transformer-XL, so there is no reference to verify against here: the
library's tests check the converter against golden outputs of
`transformers` 4.37.2 (`../shared/fixtures/transfo_xl`).
"""

import argparse
import sys

from state_dict import convert

from attention_zoo_keras.models.transformer_xl import TransformerXLCausalLM


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src")
    parser.add_argument("dest")
    args = parser.parse_args(argv)
    model = convert(TransformerXLCausalLM, args.src)
    model.save_to_preset(args.dest)
    print(f"saved {type(model).__name__} to {args.dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
