"""The documentation site (`mkdocs.yml`, `docs/`): it builds with warnings as
errors, every model family and attention mechanism has its page, and the
examples on the pages run (as doctests)."""

import doctest
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from attention_zoo_keras.attention import registry
from attention_zoo_keras.hub.catalog import list_presets

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted(path for path in DOCS.rglob("*.md") if ">>> " in path.read_text(encoding="utf-8"))


def _examples(path):
    """The page's `>>>` examples; the Markdown fences around them become
    blank lines, so that a fence never reads as expected output."""
    text = re.sub(r"^```.*$", "", path.read_text(encoding="utf-8"), flags=re.MULTILINE)
    return doctest.DocTestParser().get_doctest(text, {}, path.stem, str(path), 0)


def test_every_family_and_mechanism_has_a_page_with_an_example():
    families = {entry["family"] for entry in list_presets().values()}
    assert {path.stem for path in (DOCS / "families").glob("*.md")} == families
    assert {path.stem for path in (DOCS / "attention").glob("*.md")} == set(registry.mechanism_names()) | {"index"}
    for path in (DOCS / "families").glob("*.md"):
        text = path.read_text(encoding="utf-8")
        assert f"<!-- presets: {path.stem} -->" in text, path.name
        assert path in PAGES, f"{path.name} has no example"
    for name in registry.mechanism_names():
        path = DOCS / "attention" / f"{name}.md"
        assert f"<!-- options: {name} -->" in path.read_text(encoding="utf-8"), path.name
        assert path in PAGES, f"{path.name} has no example"


@pytest.mark.slow  # minutes, and the calls the other tests check on every backend: CI runs them on torch
@pytest.mark.parametrize("path", PAGES, ids=[str(path.relative_to(DOCS)) for path in PAGES])
def test_page_examples_run(path, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # examples that save write here
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    test = _examples(path)
    assert test.examples
    runner.run(test)
    assert runner.failures == 0, f"{runner.failures} examples of docs/{path.relative_to(DOCS)} failed (see above)"


def test_docstring_examples_render_as_code():
    """The site's griffe extension fences docstrings' doctest blocks."""
    sys.path.insert(0, str(DOCS / "hooks"))
    try:
        import doctest_blocks
    finally:
        sys.path.remove(str(DOCS / "hooks"))
    text = "Args:\n    x: a value.\n\nExample:\n\n    >>> f(\n    ...     1)\n    2\n    more\n\n    >>> g()\n"
    assert doctest_blocks.fence_doctest_blocks(text).splitlines() == [
        "Args:", "    x: a value.", "", "Example:", "",
        "    ```pycon", "    >>> f(", "    ...     1)", "    2", "    more", "    ```", "",
        "    ```pycon", "    >>> g()", "    ```",
    ]


@pytest.mark.slow  # backend-independent (the build reads the sources): CI builds it once, on torch
def test_site_builds_with_warnings_as_errors(tmp_path):
    environment = {**os.environ, "KERAS_BACKEND": os.environ.get("KERAS_BACKEND", "torch")}
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, env=environment, capture_output=True, text=True,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    assert (tmp_path / "site" / "families" / "bert" / "index.html").is_file()
