"""Every notebook in `examples/notebooks/` runs top to bottom on one of the
backends its metadata names (`metadata["attention_zoo"]["backends"]`): on
torch where it names torch, else on the first it names. A cell that raises
fails the test, so the `assert` with which a notebook checks what it
claims (the dates notebook's exact match) is checked here. Running each
notebook on its other backends too would add minutes and no coverage: what
a notebook calls (fit, generate, conversion, parity) the other tests check
on every backend. The notebooks are stored
with the outputs of a run on this kind of machine; this executes a fresh
copy and leaves them as they are."""

import os
from pathlib import Path

import keras
import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "examples" / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[path.stem for path in NOTEBOOKS])
def test_notebook_runs_top_to_bottom(path, monkeypatch):
    nbclient = pytest.importorskip("nbclient")
    import nbformat

    notebook = nbformat.read(path, as_version=4)
    backends = notebook.metadata["attention_zoo"]["backends"]
    tested_on = "torch" if "torch" in backends else backends[0]
    backend = keras.backend.backend()
    if backend != tested_on:
        pytest.skip(f"{path.name} runs on {', '.join(backends)} and is tested on {tested_on}")
    monkeypatch.setenv("KERAS_BACKEND", backend)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(path.parents[2]), os.environ.get("PYTHONPATH", "")]))
    client = nbclient.NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    )
    client.execute()  # raises CellExecutionError naming the cell that failed
    errors = [output for cell in notebook.cells for output in cell.get("outputs", []) if output.output_type == "error"]
    assert errors == []
