"""`python -m conversion` from a checkout: the `azk-convert` command line,
which lives in the package (`attention_zoo_keras.conversion.cli`) so that
an installed wheel has it too.

    python -m conversion list
    python -m conversion convert PRESET_OR_SRC --out DIR [--class CLASS] [--no-verify]
    python -m conversion convert --all --out DIR
    python -m conversion verify DIR --reference SRC
    python -m conversion publish DIR hf://org/name [--revision R] [--private]
    python -m conversion vilbert CHECKPOINT CONFIG DEST [--vocab VOCAB]
"""

import sys

from attention_zoo_keras.conversion.cli import main

if __name__ == "__main__":
    sys.exit(main())
