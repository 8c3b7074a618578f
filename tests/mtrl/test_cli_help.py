"""Every command's --help reads as help: arguments in capitals, flags without type tags."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest
import typer
from typer.testing import CliRunner

from mtrl.cli import app

runner = CliRunner()


def _commands(group: click.Group, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = [path]
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            found += _commands(command, (*path, name))
        else:
            found.append((*path, name))
    return found


@pytest.mark.parametrize("command", _commands(typer.main.get_command(app)), ids=" ".join)
def test_help_shows_no_type_tags_or_placeholders(command: tuple[str, ...]) -> None:
    result = runner.invoke(app, [*command, "--help"], env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    assert not re.search(r"<(bool|str|int|path)>|\{\w+\}", result.output), result.output
    assert "Show this message and exit." in result.output


def test_mtrl_runs_without_nodes_end_of_life_banner(tmp_path) -> None:
    """Run as a user runs it, outside `make` (nothing silences jsii for it): `mtrl config`
    loads the CDK, and prints the configuration only."""
    import os
    import subprocess
    import sys

    environment = {
        key: value
        for key, value in os.environ.items()
        if key != "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION"
    }
    ran = subprocess.run(
        [sys.executable, "-c", "from mtrl.cli import app; app()", "config"],
        capture_output=True, text=True, timeout=120, env=environment, cwd=Path(__file__).parents[2],
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert "end-of-life" not in ran.stdout + ran.stderr
