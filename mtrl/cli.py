"""`mtrl`: the command line of nova-mtrl."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from mtrl import __version__
from mtrl.env_commands import env_app
from stacks.config import ConfigError, PlatformConfig, deployment_context

app = typer.Typer(
    help="Multi-turn RL (GRPO) for Amazon Nova on SageMaker HyperPod, and offline on this machine.",
    no_args_is_help=True,
    add_completion=False,
)
app.add_typer(env_app, name="env")
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
