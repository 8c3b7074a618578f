"""What every `mtrl` command shares: its consoles, and checking a dataset file with every
problem printed as `line N: field: what is wrong`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import typer
from rich.console import Console

from domain.dataset import DatasetValidator, Problem, Summary

out = Console()
err = Console(stderr=True, soft_wrap=True, highlight=False)


def fail(*messages: str, code: int = 2) -> typer.Exit:
    """Print `error: message`, one line per message, and return the exit to raise."""
    for message in messages:
        err.print(f"error: {message}", markup=False)
    return typer.Exit(code)


def check_dataset(file: Path, on_problem: Callable[[Problem], None]) -> Summary:
    """Check `file` with the validator (exit 2 when it cannot be read): its first problems, in
    line order, go to `on_problem`."""
    if not file.is_file():
        raise fail(f"{file}: no such file (give the path of a .jsonl dataset)")
    validator = DatasetValidator()
    try:
        with file.open("rb") as stream:
            for problem in validator.problems(stream):
                on_problem(problem)
    except OSError as error:
        raise fail(f"{file}: cannot read ({error.strerror})") from None
    return validator.summary


def print_problem(problem: Problem) -> None:
    out.print(str(problem), highlight=False, soft_wrap=True, markup=False)
