"""Loading the scripts under `examples/` (no package) as modules."""

import importlib.util
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load_example(relative_path):
    """`examples/<relative_path>` imported as a module."""
    path = EXAMPLES / relative_path
    spec = importlib.util.spec_from_file_location(path.parent.name + "_" + path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
