"""`python -m attention_zoo_keras.conversion`: the `azk-convert` command
line (see `attention_zoo_keras.conversion.cli`)."""

import sys

from attention_zoo_keras.conversion.cli import main

if __name__ == "__main__":
    sys.exit(main())
