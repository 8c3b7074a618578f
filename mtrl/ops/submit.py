"""`mtrl submit`: start a run on a deployment by uploading its dataset — the config first.

The pipeline starts on the dataset's upload (EventBridge) and reads the config named by the
object's `mtrl-config` metadata: a shipped config's name, or the key of a config file that must
already be in the bucket. So a config file goes up first (under `configs/`, named after its
content), then the dataset under `training-data/`. The run id follows from the dataset object's
version, as the pipeline computes it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from domain.bucket import (
    CONFIG_METADATA_KEY,
    CONFIGS_PREFIX,
    TRAINING_DATA_PREFIX,
    UnsafeKey,
    check_dataset_key,
)
from domain.nova_job import is_nova, nova_problems
from domain.runs import run_id_for
from mtrl.ops.deployment import Deployment
from training_configs import CostEstimate, estimate, load_training_config
from training_configs.schema import DEFAULT_CONFIG, SHIPPED


class SubmitError(ValueError):
    """The submission would fail in the pipeline: refused here, before any upload."""


@dataclass(frozen=True)
class ChosenConfig:
    name: str  # what the dataset's metadata will say (a shipped name or an S3 key)
    cost: CostEstimate
    path: Path | None = None  # the local file to upload, when not a shipped config


@dataclass(frozen=True)
class Submitted:
    run_id: str
    dataset_uri: str
    config_name: str
    execution_arn: str
    console_url: str


def choose_config(config: str | None) -> ChosenConfig:
    """The config a submission uses (TrainingConfigError if invalid, SubmitError if over budget)."""
    name = config or DEFAULT_CONFIG
    training = load_training_config(name)
    if is_nova(training.model) and (problems := nova_problems(training)):
        raise SubmitError(
            f"config {name} cannot run as a Nova job (`mtrl plan --config {name}` shows the "
            "job): " + "; ".join(problems)
        )
    cost = estimate(training)
    if not cost.within_budget:
        raise SubmitError(
            f"config {name}: {cost.describe()}; raise budget_usd or lower deadline_hours or "
            "instance_count"
        )
    if name in SHIPPED:
        return ChosenConfig(name, cost)
    path = Path(name)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
    return ChosenConfig(f"{CONFIGS_PREFIX}{path.stem}-{digest}.yaml", cost, path)


def submit(
    s3: Any, deployment: Deployment, *, dataset: Path, chosen: ChosenConfig, name: str | None = None
) -> Submitted:
    """Upload the config (if a file) and then the dataset; the upload starts the run."""
    bucket = deployment.data_bucket
    key = f"{TRAINING_DATA_PREFIX}{name or dataset.name}"
    if not key.endswith(".jsonl"):
        raise SubmitError(f"{key}: the pipeline starts only for .jsonl objects; name it *.jsonl")
    try:
        check_dataset_key(key)
    except UnsafeKey as unsafe:
        raise SubmitError(f"{unsafe} (or give --name)") from None
    if chosen.path is not None:
        s3.upload_file(
            str(chosen.path), bucket, chosen.name, ExtraArgs={"ContentType": "application/yaml"}
        )
    s3.upload_file(
        str(dataset),
        bucket,
        key,
        ExtraArgs={
            "ContentType": "application/x-ndjson",
            "Metadata": {CONFIG_METADATA_KEY: chosen.name},
        },
    )
    version = s3.head_object(Bucket=bucket, Key=key).get("VersionId")
    run_id = run_id_for(bucket, key, version)
    return Submitted(
        run_id=run_id,
        dataset_uri=f"s3://{bucket}/{key}",
        config_name=chosen.name,
        execution_arn=deployment.execution_arn(run_id),
        console_url=deployment.execution_console_url(run_id),
    )
