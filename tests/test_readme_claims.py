"""Every test the README names as the proof of a claim (`tests/<file>.py::<test>`, or `::<test>`
for another test of the file named last) exists: a claim cannot outlive its proof."""

from __future__ import annotations

import re

from tests.readme import README

NAMED = re.compile(r"`(tests/[\w/]+\.py)?::(test_\w+)`")


def test_every_test_the_readme_names_exists() -> None:
    root, last, named = README.parent, None, []
    for found in NAMED.finditer(README.read_text()):
        last = found.group(1) or last
        assert last is not None, f"::{found.group(2)} names no file before it"
        named.append((last, found.group(2)))
    assert len(named) >= 10
    missing = [
        f"{path}::{test}"
        for path, test in named
        if not re.search(rf"^def {test}\(", (root / path).read_text(), re.MULTILINE)
    ]
    assert missing == []
