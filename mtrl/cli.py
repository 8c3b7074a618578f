"""`mtrl`: the command line of nova-mtrl. This module only registers the commands; each group
lives in mtrl/commands/ (local mode, environments, datasets, the platform, the run loop,
deploying a model, trajectories)."""

from __future__ import annotations

import typer

from mtrl import __version__
from mtrl.commands.datasets import plan, validate
from mtrl.commands.deploy import deploy_command
from mtrl.commands.env import env_app
from mtrl.commands.local import local
from mtrl.commands.platform import config, doctor_command, forge_cli_command
from mtrl.commands.runs import (
    cost_command,
    logs_command,
    runs_command,
    status_command,
    submit_command,
    teardown_command,
)
from mtrl.commands.trajectories import trajectories_command
from mtrl.console import out

# Where each command is documented: a page of the documentation site (docs/, `make docs`).
COMMAND_DOCS = {
    "local": "users/local-mode.md",
    "env": "users/reward-environments.md",
    "validate": "users/datasets-and-configs.md",
    "plan": "users/datasets-and-configs.md",
    "submit": "users/datasets-and-configs.md",
    "runs": "users/troubleshooting.md",
    "status": "users/run-health.md",
    "logs": "users/troubleshooting.md",
    "cost": "operators/costs.md",
    "trajectories": "users/trajectories.md",
    "teardown": "operators/what-it-deploys.md",
    "deploy": "users/deploy-a-model.md",
    "doctor": "operators/nova-on-aws.md",
    "config": "operators/configuration.md",
    "forge-cli": "operators/deploy.md",
    "version": "index.md",
}


def _docs(command: str) -> str:
    return f"Documentation: docs/{COMMAND_DOCS[command]} (the site: make docs)."


app = typer.Typer(
    help="Multi-turn RL (GRPO) for Amazon Nova on SageMaker HyperPod, and offline on this machine.",
    epilog="Documentation: README.md, then docs/ (the site: make docs).",
    no_args_is_help=True,
    add_completion=False,
)
app.add_typer(env_app, name="env", epilog=_docs("env"))


def version() -> None:
    """Print the nova-mtrl version."""
    out.print(__version__)


for _name, _command in {  # in the order a newcomer meets them
    "local": local,
    "validate": validate,
    "plan": plan,
    "config": config,
    "doctor": doctor_command,
    "submit": submit_command,
    "runs": runs_command,
    "status": status_command,
    "logs": logs_command,
    "cost": cost_command,
    "teardown": teardown_command,
    "deploy": deploy_command,
    "trajectories": trajectories_command,
    "forge-cli": forge_cli_command,
    "version": version,
}.items():
    app.command(_name, epilog=_docs(_name))(_command)


@app.callback()
def _main() -> None:
    """nova-mtrl command line."""
