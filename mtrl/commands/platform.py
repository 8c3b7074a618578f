"""`mtrl config / doctor / forge-cli`: the platform itself — what a deployment would be, whether
it is ready for a run, and the Forge launcher bundle a deploy builds with. `doctor` always prints
its whole table."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Annotated

import typer
from botocore.exceptions import BotoCoreError
from rich.table import Table

from mtrl.commands.aws import (
    AsJson,
    ConfigName,
    Prefix,
    Profile,
    Region,
    aws_failure,
    default_prefix,
)
from mtrl.console import err, fail, out
from mtrl.ops.deployment import (
    DeploymentError,
    aws_session,
)
from mtrl.ops.doctor import diagnose
from mtrl.ops.forge_cli import ForgeCliError, fetch_forge_cli
from stacks.components.project_files import PROJECT_ROOT
from stacks.config import ConfigError, PlatformConfig, deployment_context
from training_configs import TrainingConfigError, load_training_config
from training_configs.costs import HOURS_PER_MONTH, InstancePrices
from training_configs.schema import DEFAULT_CONFIG


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


def doctor_command(
    config: ConfigName = None,
    prefix: Prefix = None,
    profile: Profile = None,
    region: Region = None,
    as_json: AsJson = False,
) -> None:
    """Check credentials, region, the stacks, EKS, HyperPod, the GPU quota for a config and the
    worker image; print what to fix. Exit 0 when nothing fails, 1 otherwise."""
    try:
        training = load_training_config(config or DEFAULT_CONFIG)
    except TrainingConfigError as error:
        raise fail(str(error)) from None
    checks = diagnose(
        profile=profile, region=region, prefix=prefix or default_prefix(), config=training
    )
    if as_json:
        out.print_json(json.dumps([asdict(check) for check in checks]))
    else:
        table = Table("", "check", "found", "fix", title="mtrl doctor")
        for check in checks:
            mark = {True: "ok", False: "FAIL", None: "?"}[check.ok]
            table.add_row(mark, check.name, check.detail, check.fix)
        out.print(table)
    raise typer.Exit(1 if any(check.ok is False for check in checks) else 0)


def forge_cli_command(profile: Profile = None) -> None:
    """Fetch the Forge HyperPod CLI bundle the deployment pins (cdk.json's forge_cli_bundle) into
    the launcher image's build context, with your credentials; `make deploy` runs it first.
    Nothing to do without forge_cli_bundle (the launcher uses the public release_v2)."""
    try:
        bundle = PlatformConfig.from_context(deployment_context()).forge_cli_bundle
    except ConfigError as error:
        raise fail(str(error)) from None
    if bundle is None:
        out.print("no forge_cli_bundle configured: the launcher builds the public release_v2")
        return
    try:
        session = aws_session(profile=profile, region=None)
    except DeploymentError as error:
        raise fail(str(error)) from None
    try:
        fetched = fetch_forge_cli(session.client("s3"), bundle)
    except ForgeCliError as error:
        raise fail(str(error), code=1) from None
    except BotoCoreError as error:
        raise aws_failure(error) from None
    where = fetched.folder.relative_to(PROJECT_ROOT)
    out.print(f"fetched {fetched.files} files of {bundle.uri} into {where}", highlight=False)
    if not fetched.pinned:
        raise fail(
            f"its digest is {fetched.digest}: review {where}, then set forge_cli_bundle.sha256 "
            "to it in cdk.json (synth builds only a pinned bundle)",
            code=1,
        )
    out.print(f"digest {fetched.digest}: the pinned one", highlight=False)
