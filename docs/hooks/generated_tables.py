"""MkDocs hook: fills the tables that must never drift from the code.

A page may hold, on a line of its own,

* `<!-- presets: FAMILY -->` — the named presets of that family (name,
  class, parameters, source, license), from `presets/*.json`;
* `<!-- options: MECHANISM -->` — the options of that attention mechanism
  a user may set, with their defaults, and whether it decodes token by
  token, from the attention registry.

An unknown family or mechanism fails the build (the registry's error names
the close ones).
"""

import re

from attention_zoo_keras.attention import registry
from attention_zoo_keras.hub.catalog import presets_markdown

_MARKER = re.compile(r"^<!-- (presets|options): ([a-z_0-9]+) -->$", re.MULTILINE)


def _presets_table(family):
    table = presets_markdown(family=family)
    if table.count("\n") <= 2:
        raise ValueError(f"no named presets of family {family!r}")
    return table


def _options_table(mechanism):
    rows = ["| option | default |", "|---|---|"]
    rows += [f"| `{option}` | `{default!r}` |" for option, default in registry.mechanism_options(mechanism).items()]
    try:
        decoding = type(registry.get_decoding(mechanism)).__name__
        decodes = f"yes, with `{decoding}`"
    except ValueError:  # the mechanism has no incremental decoding
        decodes = "no"
    return "\n".join(rows) + f"\n\nToken-by-token decoding (`generate`): {decodes}.\n"


def on_page_markdown(markdown, page, config, files):
    def fill(match):
        kind, name = match.groups()
        return _presets_table(name) if kind == "presets" else _options_table(name)

    return _MARKER.sub(fill, markdown)
