"""`mtrl plan`: what a run of a training config would submit as a Nova job, read before paying.

Offline: from the config, the deployment configuration (cdk.json) and domain/nova_job.py; no
AWS call. What is only known once a run exists (its id, and so its queues' names) is shown as
placeholders.
"""

from __future__ import annotations

import functools
import json
import shlex
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml
from rich.table import Table

from domain.checkpoints import referenced_run
from domain.evaluation import TRAINING_RECORDS_OBJECT
from domain.nova_capacity import DOCUMENTED_MINIMUM_NODES
from domain.nova_job import (
    DOCUMENTED_BYOO_KEYS,
    FORGE_RECIPE_SOURCE,
    FORGE_RECIPES,
    NAMESPACE,
    NovaRefused,
    apply_overrides,
    byoo_endpoints,
    delegating,
    images,
    is_nova,
    job_layout,
    launcher_command,
    recipe_overrides,
    rollout_function_name,
    run_recipe,
)
from domain.run_queues import QueueKind, queue_name
from mtrl.console import out
from stacks.config import PlatformConfig
from training_configs.costs import estimate
from training_configs.schema import TrainingConfig, load_yaml, yaml_problem

RUN = "<run id>"
# What no offline check can settle; docs/operators/nova-on-aws.md says the same.
UNVERIFIED = (
    "the Forge BYOO recipes themselves (subscription only): the overrides are the user guide's "
    "BYOO recipe's leaves, and a key a recipe lacks is skipped (--recipe FILE lists them)",
    "the job's nodes are counted from AWS's chart (its requests and placement rules); what "
    "the kubelet and daemon sets keep of a node is not subtracted",
    "whether the Nova job needs rights beyond its dataset, outputs, queues and rollout Lambda",
    "the launcher image (HyperPod CLI and recipes, built at deploy time) has never run in Lambda",
)


@dataclass(frozen=True)
class Plan:
    config: str
    model: str
    instance_group: dict[str, Any]
    recipe: dict[str, Any]
    launcher: dict[str, Any]
    images: dict[str, str]
    namespace: str
    byoo: dict[str, str]
    # The job's nodes by what runs on them (domain/nova_capacity.py: AWS's chart).
    nodes: dict[str, int]
    cost_per_hour_usd: float
    warnings: tuple[str, ...] = ()
    unverified: tuple[str, ...] = UNVERIFIED

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def byoo_placeholders(platform: PlatformConfig, region: str) -> dict[str, str]:
    """The run's BYOO endpoints as names with the run's parts left open: its queues, and the
    deployment's rollout Lambda."""
    account = platform.account or "<account>"
    prefix = platform.name_prefix
    # A stand-in that queue names keep as it is (prefixes are lower-case), shown as the
    # placeholder.
    stand_in = "RUNID"

    def queue(kind: QueueKind) -> str:
        name = queue_name(prefix, stand_in, kind).replace(stand_in, RUN)
        return f"https://sqs.{region}.amazonaws.com/{account}/{name}"

    return byoo_endpoints(
        f"arn:aws:lambda:{region}:{account}:function:{rollout_function_name(prefix)}", queue
    )


def _base_shown(reference: str | None) -> str | None:
    """A base checkpoint as the plan can show it: an S3 URI as it is; a run's, as a placeholder
    (Register resolves it from that run's summary)."""
    run_id = referenced_run(reference or "")
    return f"<last checkpoint of run {run_id}>" if run_id else reference


def plan(
    config: TrainingConfig,
    platform: PlatformConfig,
    *,
    region: str,
    recipe_file: Path | None = None,
) -> Plan:
    """The plan of a run of `config` on `platform`; NovaRefused says what stops it."""
    if not is_nova(config.model):
        raise NovaRefused(
            f"model {config.model!r} is not a Nova model: `mtrl plan` shows Nova jobs only"
        )
    byoo = byoo_placeholders(platform, region)
    bucket = f"{platform.name_prefix}-data-{platform.account or '<account>'}-{region}"
    name = f"{platform.name_prefix}-{RUN}"
    overrides = recipe_overrides(
        config,
        name=name,
        # With a share held out for evaluation, the job trains on the dataset without it.
        data_s3_path=(
            f"s3://{bucket}/runs/{RUN}/{TRAINING_RECORDS_OBJECT}"
            if config.held_out_fraction > 0
            else f"s3://{bucket}/training-data/<dataset>.jsonl"
        ),
        output_s3_path=f"s3://{bucket}/runs/{RUN}/",
        byoo=byoo,
        base_checkpoint=_base_shown(config.base_checkpoint),
    )
    service_images = images(region)
    recipe_path = FORGE_RECIPES[config.recipe]
    rendered, skipped = None, None
    if recipe_file is not None:
        try:
            base = load_yaml(recipe_file.read_text(encoding="utf-8"))
        except yaml.YAMLError as error:
            raise NovaRefused(f"recipe {recipe_file}: {yaml_problem(error)}") from None
        if not isinstance(base, dict):
            raise NovaRefused(f"recipe {recipe_file}: expected a YAML mapping")
        built = delegating(apply_overrides(base, overrides), str(recipe_file))
        rendered, skipped = built.recipe, list(built.skipped)
    # A Nova job runs on the deployment's restricted group (the first, if it has several).
    group = platform.nova_group or platform.training_group
    warnings = []
    if not platform.nova_group:
        warnings.append(
            "this deployment has no restricted instance group: Register refuses a Nova run "
            "until hyperpod_instance_groups has one (restricted: true, with its fsx); planned "
            f"here on {group.name!r} for its instance type"
        )
    layout = job_layout(config)
    if layout.total < DOCUMENTED_MINIMUM_NODES:
        warnings.append(
            f"the job takes {layout.total} nodes, fewer than the {DOCUMENTED_MINIMUM_NODES} the "
            "Nova user guide gives as the minimum for RFT on HyperPod: a layout AWS does not "
            "document"
        )
    if group.instance_type != config.instance_type:
        raise NovaRefused(
            f"config {config.name!r} asks for {config.instance_type}; this deployment's training "
            f"instance group {group.name!r} runs {group.instance_type}"
        )
    return Plan(
        config=config.name,
        model=config.model,
        instance_group={
            "name": group.name,
            "instance_type": group.instance_type,
            "restricted": group.restricted,
            "fsx": group.fsx.model_dump() if group.fsx else None,
        },
        recipe={
            "path": recipe_path,
            "source": FORGE_RECIPE_SOURCE.format(recipe=recipe_path),
            "overrides": overrides,
            "rendered": rendered,
            # The overrides the recipe had no leaf for (None: no recipe file given).
            "skipped": skipped,
        },
        launcher={
            "command": launcher_command(
                recipe=run_recipe(config.recipe, name),
                instance_type=config.instance_type,
                container=service_images["training"],
            )
        },
        images=service_images,
        namespace=NAMESPACE,
        byoo={key: byoo[key] for key in DOCUMENTED_BYOO_KEYS},
        nodes={**asdict(layout), "total": layout.total},
        cost_per_hour_usd=round(estimate(config).per_hour, 2),
        warnings=tuple(warnings),
    )


def print_plan(made: Plan) -> None:
    """The plan for a reader: each part in a line or a short table."""
    show = functools.partial(out.print, highlight=False, soft_wrap=True)
    group = made.instance_group
    show(f"Nova job plan for config {made.config} ({made.model})")
    fsx = group["fsx"]
    storage = (
        f"{fsx['size_gib']} GiB at {fsx['per_unit_storage_throughput']} MB/s/TiB" if fsx else "none"
    )
    show(
        f"  instance group  {group['name']} ({group['instance_type']}), "
        f"restricted: {'yes' if group['restricted'] else 'no'}, FSx for Lustre: {storage}"
    )
    nodes = made.nodes
    show(
        f"  nodes           {nodes['total']}: {nodes['training']} training replicas, "
        f"{nodes['generation']} generation replicas, {nodes['services']} for the chart's CPU "
        "services (hub, prompter, RBS, NATS, Redis)"
    )
    show(f"  cost            ${made.cost_per_hour_usd:,.2f}/hour")
    show(f"  recipe          {made.recipe['path']}")
    show(f"                  from {made.recipe['source']}")
    show(f"  namespace       {made.namespace}")
    show(f"  launcher        {shlex.join(made.launcher['command'])}")
    shown = {key: json.dumps(value) for key, value in made.recipe["overrides"].items()}
    for title, rows in (
        ("recipe overrides: every leaf of that name", shown),
        ("images", made.images),
        ("BYOO endpoints", made.byoo),
    ):
        table = Table(title=title, title_justify="left")
        table.add_column(overflow="fold", no_wrap=True)
        table.add_column(overflow="fold")
        table.show_header = False
        for key, value in rows.items():
            table.add_row(key, value)
        out.print(table)
    if made.recipe["rendered"] is not None:
        show("recipe after overrides:")
        show(yaml.safe_dump(made.recipe["rendered"], sort_keys=False))
        skipped = made.recipe["skipped"]
        show(
            f"warning: the recipe has no leaf for {', '.join(skipped)}: skipped, as the Forge "
            "SDK skips them (the job runs with the recipe's own values there)"
            if skipped
            else "the recipe took every override"
        )
    for warning in made.warnings:
        show(f"warning: {warning}")
    show("unverified until a first run on AWS:")
    for item in made.unverified:
        show(f"  - {item}")
