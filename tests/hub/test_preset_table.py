"""`docs/presets.md` is the catalog: its table is `presets_markdown()`, one
row per `presets/*.json` with the file's parameter count and license."""

import json
from pathlib import Path

import pytest

from attention_zoo_keras.hub.catalog import presets_directory
from attention_zoo_keras.hub.catalog import presets_markdown

# Files, HTTP and error messages: the same code on every backend (scripts/test.sh runs it on torch).
pytestmark = pytest.mark.backend_independent

ROOT = Path(__file__).resolve().parents[2]


def test_docs_presets_md_is_the_generated_table():
    text = (ROOT / "docs" / "presets.md").read_text()
    table = text[text.index("| preset |"):]
    assert table == presets_markdown(), "docs/presets.md is stale: regenerate it with `azk-convert list --markdown`"


def test_every_preset_file_has_its_row():
    rows = {line.split(" | ")[0].strip("| `"): line for line in presets_markdown().splitlines()[2:]}
    files = sorted(presets_directory().glob("*.json"))
    assert sorted(rows) == [path.stem for path in files]
    for path in files:
        entry = json.loads(path.read_text())
        assert f"| {entry['params'] / 1e6:,.1f} M |" in rows[entry["name"]]
        assert rows[entry["name"]].endswith(f"| {entry['license']} |")
