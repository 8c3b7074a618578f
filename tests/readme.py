"""Sections of the README generated from the synthesized app and kept exact by a test:
`UPDATE_README=1` rewrites a stale one."""

from __future__ import annotations

import os
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def check_section(name: str, body: str) -> None:
    """The README's section between `<!-- name -->` and `<!-- /name -->` is `body`."""
    begin, end = f"<!-- {name} -->", f"<!-- /{name} -->"
    wanted = f"{begin}\n{body}\n{end}"
    text = README.read_text()
    start, stop = text.index(begin), text.index(end) + len(end)
    if os.environ.get("UPDATE_README"):
        README.write_text(text[:start] + wanted + text[stop:])
        text = README.read_text()
        start, stop = text.index(begin), text.index(end) + len(end)
    assert text[start:stop] == wanted, f"the README's {name} section is stale: UPDATE_README=1"
