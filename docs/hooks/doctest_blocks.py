"""Griffe extension: docstring examples render as code.

The docstrings write their examples as bare doctest blocks (`>>>` lines, `...`
continuations and the expected output, up to a blank line), which Python's
`doctest` runs but Markdown would flow into a paragraph. This wraps each
block in a ```` ```pycon ```` fence, at the block's indentation, before
mkdocstrings renders the docstring. (`mkdocs.yml` loads it.)
"""

import griffe


def fence_doctest_blocks(text):
    """`text` with every doctest block — a line starting with `>>>` and the
    lines after it up to a blank one — between a ```` ```pycon ```` line and a
    ```` ``` ```` line indented as the block (tests/test_docs.py shows one)."""
    lines, fenced, index = text.splitlines(), [], 0
    while index < len(lines):
        line = lines[index]
        if not line.lstrip().startswith(">>>"):
            fenced.append(line)
            index += 1
            continue
        indent = line[: len(line) - len(line.lstrip())]
        fenced.append(f"{indent}```pycon")
        while index < len(lines) and lines[index].strip():
            fenced.append(lines[index])
            index += 1
        fenced.append(f"{indent}```")
    return "\n".join(fenced)


class DoctestBlocks(griffe.Extension):
    def on_object(self, *, obj, **kwargs):
        if obj.docstring is not None:
            obj.docstring.value = fence_doctest_blocks(obj.docstring.value)
