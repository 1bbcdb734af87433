"""`python -m conversion`: see `conversion/cli.py` for the commands.

    python -m conversion list
    python -m conversion convert PRESET_OR_SRC --out DIR [--class CLASS] [--no-verify]
    python -m conversion convert --all --out DIR
    python -m conversion verify DIR --reference SRC
    python -m conversion publish DIR hf://org/name [--revision R] [--private]
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
