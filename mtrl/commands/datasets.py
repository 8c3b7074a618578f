"""`mtrl validate / plan`: a dataset and a config checked offline, before anything is paid for."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from domain.dataset import Problem, counted
from domain.nova_job import NovaRefused
from domain.serverless_job import ServerlessRefused
from mtrl.console import check_dataset, fail, out, print_problem
from mtrl.ops.plan import plan as make_plan
from mtrl.ops.plan import print_plan
from mtrl.ops.serverless_plan import print_serverless_plan, serverless_plan
from stacks.config import ConfigError, PlatformConfig, deployment_context
from training_configs import TrainingConfigError, load_training_config
from training_configs.schema import DEFAULT_CONFIG


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
