"""The documentation site builds offline with `mkdocs build --strict` (a broken link, a missing
anchor or a page left out of the navigation fails it), and the README stays a short tour that
links into it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.readme import DOCS, README, ROOT


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, check=False,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    assert (tmp_path / "operators" / "deploy.html").exists()  # opens from the disk


def test_the_readme_is_short_and_every_link_of_it_reaches_a_page() -> None:
    text = README.read_text()
    assert len(text.splitlines()) < 250
    targets = re.findall(r"\]\((docs/[^)#]+)(?:#[^)]*)?\)", text)
    assert len(targets) > 20
    assert [target for target in targets if not (ROOT / target).is_file()] == []
    pages = {path.relative_to(ROOT).as_posix() for path in DOCS.rglob("*.md")} - {"docs/index.md"}
    assert pages - set(targets) == set()  # every page is reachable from the README


def test_every_command_s_help_names_its_page() -> None:
    from typer.testing import CliRunner

    from mtrl.cli import COMMAND_DOCS, app

    names = [command.name or command.callback.__name__ for command in app.registered_commands]
    names += [group.name for group in app.registered_groups]
    assert sorted(names) == sorted(COMMAND_DOCS)
    runner = CliRunner()
    for name, page in COMMAND_DOCS.items():
        assert (DOCS / page).is_file(), page
        shown = runner.invoke(app, [name, "--help"], terminal_width=200)
        assert shown.exit_code == 0 and f"docs/{page}" in shown.output, name
