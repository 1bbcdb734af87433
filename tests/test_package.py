"""Package-level promises: backend isolation, shipped presets, runnable docs."""

import doctest
import importlib
import os
import pkgutil
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import attention_zoo_keras

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.backend_independent  # each subprocess sets its own backend
@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_importing_under_jax_or_torch_does_not_import_tensorflow(backend):
    code = (
        "import sys, attention_zoo_keras as azk\n"
        "azk.models.BertBackbone(vocabulary_size=10, num_layers=1, num_heads=1, hidden_dim=4, intermediate_dim=4)\n"
        "assert 'tensorflow' not in sys.modules, sorted(m for m in sys.modules if m.startswith('tensorflow'))[:5]\n"
    )
    environment = {**os.environ, "KERAS_BACKEND": backend}
    subprocess.run([sys.executable, "-c", code], check=True, env=environment, cwd=ROOT)


def _modules():
    for info in pkgutil.walk_packages(attention_zoo_keras.__path__, "attention_zoo_keras."):
        yield importlib.import_module(info.name)


def test_only_backend_support_imports_a_backend():
    """Backend-specific code lives in `attention_zoo_keras/backend_support/`;
    everything else is written against `keras.ops`. (The conversion tools
    read `transformers` checkpoints with torch as a file format and a
    reference, whatever the Keras backend.)"""
    package = ROOT / "attention_zoo_keras"
    offenders = []
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package).as_posix()
        if relative.startswith(("backend_support/", "conversion/")):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.match(r"\s*(import|from)\s+(jax|jaxlib|tensorflow|torch)\b", line):
                offenders.append(f"{relative}:{number}: {line.strip()}")
    assert offenders == []


@pytest.mark.slow  # every example of the package: minutes, and the same code the other tests cover per backend
def test_docstring_examples_run():
    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    examples = 0
    for module in _modules():
        for test in finder.find(module):
            examples += len(test.examples)
            runner.run(test)
    assert examples > 20
    assert runner.failures == 0, f"{runner.failures} docstring examples failed (see the output above)"


@pytest.mark.slow
def test_wheel_ships_the_named_presets(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        check=True,
    )
    (wheel,) = tmp_path.glob("attention_zoo_keras-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    presets = sorted(path.name for path in (ROOT / "presets").glob("*.json"))
    assert "linear_transformer_gpt2.json" in presets and "vit_base_patch16_224.json" in presets
    for preset in presets:
        assert f"attention_zoo_keras/presets/{preset}" in names
    assert not any(name.startswith(("tests/", "benchmarks/")) for name in names)


def test_the_tests_read_no_file_outside_the_repository():
    """A fresh clone runs its tests alone (issue 19, item 12): golden outputs of
    references that cannot be installed here live in `tests/fixtures`, each with
    the README saying how it was made, and no test reaches for `../shared`."""
    for name in ("transfo_xl", "vilbert"):
        fixture = ROOT / "tests" / "fixtures" / name
        assert {"README.md", "config.json", "model.safetensors", "outputs.safetensors"} <= {
            path.name for path in fixture.iterdir()
        }
    offenders = [
        str(path.relative_to(ROOT))
        for path in (ROOT / "tests").rglob("*.py")
        if path != Path(__file__).resolve()
        and ('"shared"' in path.read_text(encoding="utf-8") or "../shared" in path.read_text(encoding="utf-8"))
    ]
    assert offenders == []
