"""Named presets: one JSON file per preset in the `presets/` folder.

Each file names the class the preset builds, the hub source its files come
from, a description, the parameter count and the license; optionally
`config_overrides`, backbone arguments that replace the source's (a preset
that reuses another checkpoint's weights in a different architecture, such
as `linear_transformer_gpt2`: GPT-2's weights with linear attention). The folder ships
inside the wheel as `attention_zoo_keras/presets/`; in a source checkout it is
the repository's top-level `presets/`.
"""

import functools
import json
from pathlib import Path

from attention_zoo_keras.naming import did_you_mean

_PACKAGE_DIR = Path(__file__).resolve().parent.parent
_REQUIRED_FIELDS = ("name", "class_name", "family", "source", "description", "params", "license")


class UnknownPresetError(ValueError):
    """A preset handle is neither a known name, an `hf://` handle nor a directory."""


def presets_directory():
    """The folder holding the named presets' JSON files."""
    for candidate in (_PACKAGE_DIR / "presets", _PACKAGE_DIR.parent / "presets"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"No presets folder found next to {_PACKAGE_DIR}.")


@functools.cache
def _catalog():
    catalog = {}
    for path in sorted(presets_directory().glob("*.json")):
        entry = json.loads(path.read_text())
        missing = [field for field in _REQUIRED_FIELDS if field not in entry]
        if missing:
            raise ValueError(f"Preset file {path} lacks the fields {missing}.")
        if entry["name"] != path.stem:
            raise ValueError(f"Preset file {path} is named '{entry['name']}' inside.")
        catalog[entry["name"]] = entry
    return catalog


def list_presets(family=None):
    """Named presets as `{name: entry}`, optionally only those of one family.

    Example:

    >>> "bert_base" in list_presets(family="bert")
    True
    """
    return {
        name: dict(entry)
        for name, entry in _catalog().items()
        if family is None or entry["family"] == family
    }


def presets_markdown(family=None):
    """The named presets as a Markdown table: name, family, class,
    parameters, source (linked where it is on the Hub) and license, one row
    per preset in name order. `docs/presets.md` is this table (`azk-convert
    list --markdown` prints it), so the documentation never drifts from the
    catalog.

    Example:

    >>> print(presets_markdown(family="bert").splitlines()[0])
    | preset | family | class | parameters | source | license |
    """
    rows = ["| preset | family | class | parameters | source | license |", "|---|---|---|---|---|---|"]
    for name, entry in sorted(list_presets(family).items()):
        source = entry["source"]
        if source.startswith("hf://"):
            repository = source.removeprefix("hf://").split("@")[0]
            source = f"[{source.removeprefix('hf://')}](https://huggingface.co/{repository})"
        parameters = f"{entry['params'] / 1e6:,.1f} M"
        rows.append(f"| `{name}` | {entry['family']} | `{entry['class_name']}` | {parameters} | {source} | "
                    f"{entry['license']} |")
    return "\n".join(rows) + "\n"


def get_preset(name, family=None):
    """The catalog entry of the preset called `name`.

    Args:
        name: str. The preset's name.
        family: str or None. If given, the preset must belong to this model
            family.

    Raises:
        UnknownPresetError: listing the closest known names (of `family`,
            when given), or saying which family a preset of another belongs to.
    """
    catalog = _catalog()
    candidates = sorted(n for n, entry in catalog.items() if family is None or entry["family"] == family)
    if name in catalog and name not in candidates:
        raise UnknownPresetError(
            f"Preset '{name}' is a {catalog[name]['family']} model, not {family}; "
            f"{family} presets: {', '.join(candidates)}."
        )
    if name not in catalog:
        hint = did_you_mean(name, candidates, n=4, cutoff=0.5)
        kind = f"{family} " if family else ""
        raise UnknownPresetError(
            f"Unknown preset '{name}'.{hint} A preset is a known name, "
            f"'hf://org/repo[@revision]' or a local directory; known {kind}names: "
            f"{', '.join(candidates)}."
        )
    return dict(catalog[name])
