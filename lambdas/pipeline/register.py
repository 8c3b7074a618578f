"""Register a run for an uploaded dataset: its id, its training config, its cost, its budget.

The config is chosen by the dataset object's S3 metadata `mtrl-config` (a shipped config
name, or the key of a YAML file in the same bucket), falling back to the deployment's default.
A run whose cost at full burn over its deadline exceeds its budget, or whose base checkpoint
cannot be used, is refused before anything is created.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from domain.bucket import CONFIG_METADATA_KEY, CONFIGS_PREFIX, check_dataset_key, object_exists
from domain.checkpoints import BaseCheckpoint
from domain.nova_job import NO_NOVA_GROUP, is_nova, nova_problems
from domain.presets import ModelPreset, preset_for
from domain.runs import RunRecord, RunStore, run_id_for
from domain.serverless_job import NO_SERVERLESS_PLANE, serverless_problems
from lambdas.pipeline.checkpoints import resolve_base
from training_configs import (
    CostEstimate,
    InstancePrices,
    TrainingConfig,
    estimate,
    load_training_config,
)
from training_configs.schema import SHIPPED, TrainingConfigError, parse_training_config


class BudgetExceeded(ValueError):
    """The run could cost more than its config's budget allows."""


@dataclass(frozen=True)
class Registered:
    run: RunRecord
    created: bool
    config: TrainingConfig
    cost: CostEstimate
    base: BaseCheckpoint | None = None


def resolve_config(
    s3: Any, *, bucket: str, key: str, version_id: str | None, default: str
) -> tuple[str, TrainingConfig]:
    extra = {"VersionId": version_id} if version_id else {}
    metadata = s3.head_object(Bucket=bucket, Key=key, **extra).get("Metadata", {})
    name = metadata.get(CONFIG_METADATA_KEY) or default
    if name in SHIPPED:
        return name, load_training_config(name)
    config_key = name.removeprefix(f"s3://{bucket}/")
    if not config_key.startswith(CONFIGS_PREFIX):
        raise TrainingConfigError(
            f"config {name!r} (named by {CONFIG_METADATA_KEY} of {key}) is neither a shipped config "
            f"({', '.join(SHIPPED)}) nor under s3://{bucket}/{CONFIGS_PREFIX}: upload it there "
            "(mtrl submit does)"
        )
    if not object_exists(s3, bucket=bucket, key=config_key):
        raise TrainingConfigError(
            f"config s3://{bucket}/{config_key}: no such object (named by {CONFIG_METADATA_KEY} of {key}); "
            f"upload it or use one of {', '.join(SHIPPED)}"
        )
    text = s3.get_object(Bucket=bucket, Key=config_key)["Body"].read().decode("utf-8")
    return name, parse_training_config(text, f"s3://{bucket}/{config_key}")


def register_run(
    s3: Any,
    runs: RunStore,
    *,
    bucket: str,
    key: str,
    version_id: str | None,
    default_config: str,
    now: float,
    prices: InstancePrices | None = None,
    presets: dict[str, ModelPreset] | None = None,
    instance_type: str | None = None,
    nova_instance_type: str | None = None,
    serverless_plane: bool = False,
) -> Registered:
    """`presets` and `instance_type`: what the standard group offers an open-weights model;
    `nova_instance_type`: the restricted group's, for a Nova model (None: no such group);
    `serverless_plane`: whether the deployment runs SageMaker's managed job. The config must fit
    the plane it picks (a HyperPod plane unchecked when `presets` is None: no planes told)."""
    check_dataset_key(key)
    run_id = run_id_for(bucket, key, version_id)
    name, config = resolve_config(
        s3, bucket=bucket, key=key, version_id=version_id, default=default_config
    )
    cost = estimate(config, prices)
    if not cost.within_budget:
        raise BudgetExceeded(
            f"run {run_id} ({name}): {cost.describe()}; raise budget_usd or lower deadline_hours or "
            "instance_count in the config"
        )
    if config.plane == "serverless":
        _check_serverless(name, config, serverless_plane)
    elif is_nova(config.model):
        _check_nova(name, config, nova_instance_type, planes_known=presets is not None)
    else:
        if instance_type is not None and config.instance_type != instance_type:
            raise TrainingConfigError(
                f"config {name}: instance_type: {config.instance_type} is not what this "
                f"deployment's training instance group runs ({instance_type}); set "
                f"instance_type: {instance_type}"
            )
        if presets is not None:
            preset_for(config, presets)
    base = resolve_base(s3, bucket=bucket, config=config, name=name)
    record = RunRecord(
        run_id=run_id,
        bucket=bucket,
        key=key,
        version_id=version_id,
        config_name=name,
        created_at=now,
        updated_at=now,
        deadline_at=now + config.deadline_hours * 3600,
        cost_per_hour=cost.per_hour,
        config=config,
    )
    stored, created = runs.register(record)
    return Registered(stored, created, config, cost, base)


def _check_serverless(name: str, config: TrainingConfig, plane: bool) -> None:
    """A serverless config runs as SageMaker's managed job, as AWS's template takes it."""
    if not plane:
        raise TrainingConfigError(f"config {name}: plane: serverless {NO_SERVERLESS_PLANE}")
    if problems := serverless_problems(config):
        raise TrainingConfigError(
            f"config {name} cannot run as SageMaker's managed job (`mtrl plan --config` shows "
            "the job): " + "; ".join(problems)
        )


def _check_nova(
    name: str, config: TrainingConfig, instance_type: str | None, *, planes_known: bool
) -> None:
    """A Nova model trains on the deployment's restricted group, as AWS's recipe allows."""
    if planes_known and instance_type is None:
        raise TrainingConfigError(f"config {name}: model {config.model} {NO_NOVA_GROUP}")
    if instance_type is not None and config.instance_type != instance_type:
        raise TrainingConfigError(
            f"config {name}: instance_type: {config.instance_type} is not what this deployment's "
            f"restricted instance group runs ({instance_type}); set instance_type: {instance_type}"
        )
    if problems := nova_problems(config):
        raise TrainingConfigError(
            f"config {name} cannot run as a Nova job (`mtrl plan --config` shows the job): "
            + "; ".join(problems)
        )
