"""The README and the documentation site's pages (docs/): the sections generated from the code
and kept exact by a test (`UPDATE_README=1` rewrites a stale one), and their text for the tests
that read what they claim."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"


def documents() -> list[Path]:
    """The README, then every page of the documentation site."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def document_with(marker: str) -> Path:
    """The one document that holds `marker`."""
    holding = [path for path in documents() if marker in path.read_text()]
    assert len(holding) == 1, f"{marker!r} is in {len(holding)} documents: {holding}"
    return holding[0]


def check_section(name: str, body: str) -> None:
    """The section between `<!-- name -->` and `<!-- /name -->` (in the README or a docs page)
    is `body`."""
    begin, end = f"<!-- {name} -->", f"<!-- /{name} -->"
    wanted = f"{begin}\n{body}\n{end}"
    path = document_with(begin)
    text = path.read_text()
    start, stop = text.index(begin), text.index(end) + len(end)
    if os.environ.get("UPDATE_README"):
        path.write_text(text[:start] + wanted + text[stop:])
        text = path.read_text()
        start, stop = text.index(begin), text.index(end) + len(end)
    where = path.relative_to(ROOT)
    assert text[start:stop] == wanted, f"{where}'s {name} section is stale: UPDATE_README=1"
