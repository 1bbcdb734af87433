"""Driving `python -m conversion` in-process from tests: `run` (the command
line's exit code and output) and `perturb_a_kernel` (a saved preset's weight
moved so that its parity check fails)."""

from pathlib import Path

import numpy as np
from safetensors.numpy import load_file
from safetensors.numpy import save_file

from attention_zoo_keras.conversion import cli


def run(capsys, *argv):
    """`(exit code, stdout, stderr)` of the command line."""
    code = cli.main([str(arg) for arg in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def perturb_a_kernel(directory):
    """Adds 0.05 to the first 2-D kernel of the preset saved in `directory`
    (in `model.safetensors`) and returns its key."""
    weights_file = Path(directory) / "model.safetensors"
    weights = load_file(str(weights_file))
    key = next(key for key in sorted(weights) if key.endswith("kernel") and weights[key].ndim == 2)
    weights[key] = weights[key] + np.float32(0.05)
    save_file(weights, str(weights_file))
    return key
