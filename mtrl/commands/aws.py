"""What the commands on a deployed platform share: the options that find the deployment
(`--prefix`, `--profile`, `--region`), finding it — failing with every missing prerequisite at
once, one line each —, AWS's refusals as one line, and a change's outcome as a line or JSON."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Annotated, Any

import boto3
import typer
from botocore.exceptions import BotoCoreError, ClientError

from mtrl.console import fail, out
from mtrl.ops.deployment import (
    Deployment,
    DeploymentError,
    aws_session,
    find_deployment,
    missing_prerequisites,
)
from stacks.config import ConfigError, PlatformConfig, deployment_context


def default_prefix() -> str:
    try:
        return PlatformConfig.from_context(deployment_context()).name_prefix
    except (ConfigError, OSError, ValueError):
        return PlatformConfig.model_fields["name_prefix"].default


Prefix = Annotated[
    str | None,
    typer.Option(help="The deployment's name_prefix (default: cdk.json's, else nova-mtrl)."),
]

Profile = Annotated[str | None, typer.Option(help="The AWS profile to use.")]

Region = Annotated[str | None, typer.Option(help="The AWS region it is deployed in.")]

AsJson = Annotated[bool, typer.Option("--json", help="Print JSON, for scripts.")]

ConfigName = Annotated[
    str | None,
    typer.Option(
        "--config",
        help="A training config: a YAML file or a shipped name (default: rft_multiturn_lora).",
    ),
]


def deployed(
    prefix: str | None, profile: str | None, region: str | None
) -> tuple[boto3.Session, Deployment]:
    try:
        session = aws_session(profile=profile, region=region)
    except DeploymentError as error:
        raise fail(str(error)) from None
    if missing := missing_prerequisites(session):
        raise fail(*missing)
    try:
        return session, find_deployment(session, prefix or default_prefix())
    except DeploymentError as error:
        raise fail(str(error)) from None


def aws_failure(error: ClientError | BotoCoreError) -> typer.Exit:
    if isinstance(error, ClientError):
        detail = f"{error.response['Error']['Code']}: {error.response['Error'].get('Message', '')}"
    else:
        detail = str(error)
    return fail(f"AWS refused the call ({detail})", code=1)


def apply_change(
    work: Callable[[], tuple[dict[str, Any], str]],
    *,
    refusals: tuple[type[Exception], ...],
    as_json: bool,
) -> None:
    """Do `work` (what it did, and the line saying so), its failures as one line: exit 1 for
    `refusals` and AWS's refusals, 2 for a deployment that cannot be used."""
    try:
        result, message = work()
    except refusals as error:
        raise fail(str(error), code=1) from None
    except DeploymentError as error:
        raise fail(str(error)) from None
    except (ClientError, BotoCoreError) as error:
        raise aws_failure(error) from None
    if as_json:
        out.print_json(json.dumps(result))
    else:
        out.print(message, highlight=False, soft_wrap=True)
