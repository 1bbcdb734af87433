"""`azk-convert` ships in the wheel: its modules and its entry point are in
the built distribution, and the installed command runs outside a checkout
(no `conversion/` folder, no `sys.path` edit)."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODULES = (
    "__init__", "__main__", "cli", "command_arguments", "verified_conversion", "state_dict", "verifiers",
    "reference_comparison", "linear_attention_reference", "vilbert", "vilbert_conversion", "vilbert_verification",
)


@pytest.mark.slow
def test_the_wheel_ships_azk_convert_and_it_runs_outside_the_checkout(tmp_path):
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(ROOT)], check=True
    )
    (wheel,) = wheels.glob("attention_zoo_keras-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (entry_points,) = [name for name in names if name.endswith(".dist-info/entry_points.txt")]
        scripts = archive.read(entry_points).decode()
    for module in MODULES:
        assert f"attention_zoo_keras/conversion/{module}.py" in names
    assert "azk-convert = attention_zoo_keras.conversion.cli:main" in scripts
    assert not any(name.startswith("conversion/") for name in names)  # the checkout's wrapper stays out

    installed = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(installed), str(wheel)],
        check=True,
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    environment = {**os.environ, "PYTHONPATH": str(installed)}
    done = subprocess.run(
        [str(installed / "bin" / "azk-convert"), "list", "--family", "bert"],
        cwd=elsewhere, env=environment, capture_output=True, text=True,
    )
    assert done.returncode == 0, done.stderr
    assert "bert_tiny" in done.stdout and "BertBackbone" in done.stdout and "gpt2" not in done.stdout
    done = subprocess.run(
        [str(installed / "bin" / "azk-convert"), "vilbert", "--help"],
        cwd=elsewhere, env=environment, capture_output=True, text=True,
    )
    assert done.returncode == 0 and "--vocab" in done.stdout and "CHECKPOINT" in done.stdout

    # The command ran the installed copy, not this checkout.
    where = subprocess.run(
        [sys.executable, "-c", "import attention_zoo_keras.conversion.cli as cli; print(cli.__file__)"],
        cwd=elsewhere, env=environment, capture_output=True, text=True, check=True,
    )
    assert Path(where.stdout.strip()).is_relative_to(installed)
