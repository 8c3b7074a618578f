"""Every test the README or a docs page names as the proof of a claim (`tests/<file>.py::<test>`,
or `::<test>` for another test of the file named last in that document) exists: a claim cannot
outlive its proof."""

from __future__ import annotations

import re

from tests.readme import ROOT, documents

NAMED = re.compile(r"`(tests/[\w/]+\.py)?::(test_\w+)`")


def test_every_test_the_documents_name_exists() -> None:
    root, named = ROOT, []
    for document in documents():
        last = None
        for found in NAMED.finditer(document.read_text()):
            last = found.group(1) or last
            assert last is not None, f"{document.name}: ::{found.group(2)} names no file before it"
            named.append((last, found.group(2)))
    assert len(named) >= 10
    missing = [
        f"{path}::{test}"
        for path, test in named
        if not re.search(rf"^def {test}\(", (root / path).read_text(), re.MULTILINE)
    ]
    assert missing == []
