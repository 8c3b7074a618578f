"""`mtrl`: the command line of nova-mtrl."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from domain.dataset import Problem, counted
from domain.nova_job import NovaRefused
from domain.serverless_job import ServerlessRefused
from mtrl import __version__
from mtrl.console import check_dataset, err, fail, out, print_problem
from mtrl.env_commands import env_app
from mtrl.local_command import local
from mtrl.ops.plan import plan as make_plan
from mtrl.ops.plan import print_plan
from mtrl.ops.serverless_plan import print_serverless_plan, serverless_plan
from mtrl.ops_commands import (
    cost_command,
    deploy_command,
    doctor_command,
    forge_cli_command,
    logs_command,
    runs_command,
    status_command,
    submit_command,
    teardown_command,
)
from mtrl.trajectories_command import trajectories_command
from stacks.config import ConfigError, PlatformConfig, deployment_context
from training_configs import TrainingConfigError, load_training_config
from training_configs.costs import HOURS_PER_MONTH, InstancePrices
from training_configs.schema import DEFAULT_CONFIG

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
for _name, _command in {
    "local": local,
    "submit": submit_command,
    "runs": runs_command,
    "status": status_command,
    "cost": cost_command,
    "logs": logs_command,
    "trajectories": trajectories_command,
    "teardown": teardown_command,
    "deploy": deploy_command,
    "doctor": doctor_command,
    "forge-cli": forge_cli_command,
}.items():
    app.command(_name, epilog=_docs(_name))(_command)


@app.callback()
def _main() -> None:
    """nova-mtrl command line."""


@app.command(epilog=_docs("version"))
def version() -> None:
    """Print the nova-mtrl version."""
    out.print(__version__)


@app.command(epilog=_docs("validate"))
def validate(
    file: Annotated[Path, typer.Argument(help="The dataset (.jsonl) to check.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Check a dataset: its problems as `line N: field: what is wrong`, in line order (the first
    1000; all are counted); exit 0 valid, 1 invalid."""
    problems: list[Problem] = []
    summary = check_dataset(file, problems.append)
    if as_json:
        out.print_json(
            json.dumps(
                {
                    "file": str(file),
                    "valid": summary.valid,
                    "records": summary.records,
                    "problems": [problem.as_dict() for problem in problems],
                    "problem_count": summary.problems,
                }
            )
        )
    elif summary.valid:
        out.print(
            f"{file}: valid, {counted(summary.records, 'record')}", highlight=False, soft_wrap=True
        )
    else:
        for problem in problems:
            print_problem(problem)
        shown = f" (the first {len(problems)} above)" if len(problems) < summary.problems else ""
        out.print(
            f"{file}: invalid, {counted(summary.problems, 'problem')}{shown} in "
            f"{counted(summary.lines, 'line')}",
            highlight=False,
            soft_wrap=True,
        )
    raise typer.Exit(0 if summary.valid else 1)


@app.command(epilog=_docs("plan"))
def plan(
    config: Annotated[
        str | None,
        typer.Option(
            "--config",
            help="A training config: a YAML file or a shipped name (default: rft_multiturn_lora).",
        ),
    ] = None,
    region: Annotated[
        str | None, typer.Option(help="The region to plan for (default: cdk.json's region).")
    ] = None,
    recipe: Annotated[
        Path | None,
        typer.Option(
            help="A Forge recipe file, or the user guide's BYOO recipe: show it after the "
            "overrides, with the keys it skipped."
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan as JSON.")] = False,
) -> None:
    """What a run of a config would submit, offline. A Nova job: instance group, recipe and
    overrides, launcher command, images, BYOO endpoints, the job's nodes, cost per hour. A
    serverless config: the CreateJob request, its job document and hyperparameters."""
    try:
        training = load_training_config(config or DEFAULT_CONFIG)
        platform = PlatformConfig.from_context(deployment_context({}))
    except (TrainingConfigError, ConfigError) as error:
        raise fail(str(error)) from None
    chosen_region = region or platform.region
    if chosen_region is None:
        raise fail("no region: pass --region (cdk.json sets none)")
    if training.plane == "serverless":
        if recipe is not None:
            raise fail("--recipe: a serverless config has no HyperPod recipe; leave it out")
        try:
            managed = serverless_plan(training, platform, region=chosen_region)
        except ServerlessRefused as error:
            raise fail(str(error), code=1) from None
        if as_json:
            out.print_json(json.dumps(managed.as_dict()))
        else:
            print_serverless_plan(managed)
        return
    try:
        made = make_plan(training, platform, region=chosen_region, recipe_file=recipe)
    except NovaRefused as error:
        raise fail(str(error), code=1) from None
    except OSError as error:
        raise fail(f"recipe {recipe}: cannot read ({error.strerror})") from None
    if as_json:
        out.print_json(json.dumps(made.as_dict()))
        return
    print_plan(made)


@app.command(epilog=_docs("config"))
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
    if resolved.nova_notice:
        out.print(f"note: {resolved.nova_notice}", highlight=False, soft_wrap=True)
    for line in idle_costs(resolved, InstancePrices.load()):
        out.print(line, highlight=False, soft_wrap=True)


def idle_costs(platform: PlatformConfig, prices: InstancePrices) -> list[str]:
    """What the deployment costs between runs, by what bills while it exists (approximate)."""
    lines = [f"idle: platform ~${prices.platform_idle_per_hour:,.2f}/hour"]
    for group in platform.hyperpod_instance_groups:
        if group.fsx is not None:
            hourly = prices.fsx_lustre_per_hour(
                size_gib=group.fsx.size_gib, throughput=group.fsx.per_unit_storage_throughput
            )
            lines.append(
                f"idle: FSx for Lustre of restricted group {group.name!r} "
                f"({group.fsx.size_gib:,} GiB at {group.fsx.per_unit_storage_throughput} "
                f"MB/s/TiB) ~${hourly:,.2f}/hour (~${hourly * HOURS_PER_MONTH:,.0f}/month), "
                "at any node count; nova_restricted_group: false removes the default one"
            )
    return lines


if __name__ == "__main__":
    app()
