"""`mtrl`: the command line of nova-mtrl."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from mtrl import __version__
from mtrl.dataset import DatasetValidator
from mtrl.env_commands import env_app
from mtrl.local_command import local
from stacks.config import ConfigError, PlatformConfig, deployment_context

app = typer.Typer(
    help="Multi-turn RL (GRPO) for Amazon Nova on SageMaker HyperPod, and offline on this machine.",
    no_args_is_help=True,
    add_completion=False,
)
app.add_typer(env_app, name="env")
app.command("local")(local)
out = Console()
err = Console(stderr=True, soft_wrap=True, highlight=False)


@app.callback()
def _main() -> None:
    """nova-mtrl command line."""


@app.command()
def version() -> None:
    """Print the nova-mtrl version."""
    out.print(__version__)


@app.command()
def validate(
    file: Annotated[Path, typer.Argument(help="The dataset (.jsonl) to check.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Check a dataset: every problem as `line N: field: what is wrong`; exit 0 valid, 1 invalid."""
    if not file.is_file():
        err.print(f"error: {file}: no such file (give the path of a .jsonl dataset)")
        raise typer.Exit(2)
    validator = DatasetValidator()
    found = []
    try:
        with file.open("rb") as stream:
            for problem in validator.problems(stream):
                if as_json:
                    found.append(problem.as_dict())
                else:
                    out.print(str(problem), highlight=False, soft_wrap=True, markup=False)
    except OSError as error:
        err.print(f"error: {file}: cannot read ({error.strerror})")
        raise typer.Exit(2) from None
    summary = validator.summary
    if as_json:
        out.print_json(
            json.dumps(
                {
                    "file": str(file),
                    "valid": summary.valid,
                    "records": summary.records,
                    "problems": found,
                }
            )
        )
    elif summary.valid:
        out.print(f"{file}: valid, {summary.records} records", highlight=False, soft_wrap=True)
    else:
        noun = "problem" if summary.problems == 1 else "problems"
        out.print(
            f"{file}: invalid, {summary.problems} {noun} in {summary.lines} lines",
            highlight=False,
            soft_wrap=True,
        )
    raise typer.Exit(0 if summary.valid else 1)


@app.command()
def config(
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            "-c",
            metavar="KEY=VALUE",
            help="Override a cdk.json context key, as `cdk -c` does.",
        ),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the configuration as JSON.")
    ] = False,
) -> None:
    """Show the deployment configuration `cdk deploy` would use, or why it is invalid."""
    overrides: dict[str, str] = {}
    for item in set_ or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            err.print(f"[red]error:[/] --set expects KEY=VALUE, got {item!r}")
            raise typer.Exit(2)
        overrides[key] = value
    try:
        resolved = PlatformConfig.from_context(deployment_context(overrides))
    except ConfigError as error:
        err.print(f"[red]error:[/] {error}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
    data = resolved.model_dump(mode="json")
    if as_json:
        out.print_json(json.dumps(data))
        return
    table = Table("key", "value", title="nova-mtrl deployment configuration")
    for key, value in data.items():
        table.add_row(key, json.dumps(value))
    out.print(table)


if __name__ == "__main__":
    app()
