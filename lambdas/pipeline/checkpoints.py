"""Finding a run's checkpoints (Collect), naming the best, and resolving where a run starts from
(Register): the bucket side of domain/checkpoints.py."""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from domain.bucket import SUMMARY_OBJECT, object_exists, run_output_prefix
from domain.checkpoints import (
    MANIFEST_OBJECT,
    NOVA_MANIFEST,
    BaseCheckpoint,
    Checkpoint,
    CheckpointManifest,
    latest,
    referenced_run,
)
from domain.evaluation import EvaluationReport
from training_configs.schema import TrainingConfig


class CheckpointRefused(ValueError):
    """A config's base_checkpoint that cannot be used; nothing was created."""


def recorded_checkpoints(
    s3: Any, *, bucket: str, prefix: str, outputs: list[str]
) -> list[Checkpoint]:
    """The checkpoints the run's jobs recorded: each Nova job's manifest and where it points (a
    manifest that cannot be read is kept, its location unknown), then our trainers'."""
    found = []
    for output in outputs:
        job, _, name = output.rpartition("/")
        if output == MANIFEST_OBJECT or name != NOVA_MANIFEST or "/" in job or not job:
            continue
        body = s3.get_object(Bucket=bucket, Key=f"{prefix}{output}")["Body"].read()
        try:
            location = json.loads(body).get("checkpoint_s3_bucket")
        except (json.JSONDecodeError, AttributeError):
            location = None
        found.append(Checkpoint(name=job, manifest=f"s3://{bucket}/{prefix}{output}", uri=location))
    if MANIFEST_OBJECT in outputs:
        manifest_uri = f"s3://{bucket}/{prefix}{MANIFEST_OBJECT}"
        body = s3.get_object(Bucket=bucket, Key=f"{prefix}{MANIFEST_OBJECT}")["Body"].read()
        manifest = CheckpointManifest.model_validate_json(body)
        found += [
            Checkpoint(
                name=saved.name,
                manifest=manifest_uri,
                uri=f"s3://{bucket}/{saved.key}",
                step=saved.step,
                mean_reward=saved.mean_reward,
            )  # fmt: skip
            for saved in manifest.checkpoints
        ]
    return found


def best_checkpoint(
    checkpoints: list[Checkpoint], evaluation: EvaluationReport
) -> dict[str, Any] | None:
    """The checkpoint to use: the one training ended with, unless the held-out evaluation found
    the starting model better (then none, and why). Only the final checkpoint is evaluated."""
    final = latest(checkpoints)
    if final is None:
        return None
    change = evaluation.delta.get("pass_at_1") or evaluation.delta.get("mean_reward")
    if change is None:
        why = "the last checkpoint; no held-out evaluation compared it with the start"
    elif change.delta < 0:
        return {
            "name": None,
            "uri": None,
            "why": "the starting model did better on the held-out records",
        }
    else:
        why = "the last checkpoint, at least as good as the start on the held-out records"
    return {"name": final.name, "uri": final.uri, "why": why}


def resolve_base(
    s3: Any, *, bucket: str, config: TrainingConfig, name: str
) -> BaseCheckpoint | None:
    """Where a run of `config` starts from: an S3 URI as given, or the last checkpoint of the run
    it names — refused when that run left no summary or checkpoint, or trained another model."""
    reference = config.base_checkpoint
    if reference is None:
        return None
    run_id = referenced_run(reference)
    if run_id is None:
        return BaseCheckpoint(uri=reference)
    where = f"config {name}: base_checkpoint {reference}"
    key = f"{run_output_prefix(run_id)}{SUMMARY_OBJECT}"
    if not object_exists(s3, bucket=bucket, key=key):
        raise CheckpointRefused(
            f"{where}: run {run_id} left no results (no s3://{bucket}/{key}); start from a run "
            "that succeeded (`mtrl runs`), or give the checkpoint's S3 URI"
        )
    try:
        summary = json.loads(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
        model = summary["config"]["model"]
        checkpoints = [Checkpoint.model_validate(c) for c in summary["checkpoints"]]
    except (json.JSONDecodeError, KeyError, TypeError, ValidationError) as error:
        raise CheckpointRefused(f"{where}: s3://{bucket}/{key} cannot be read ({error})") from None
    if model != config.model:
        raise CheckpointRefused(
            f"{where}: run {run_id} trained {model}, not this config's model {config.model}; "
            f"set model: {model} or start from a run of {config.model}"
        )
    found = latest(checkpoints)
    if found is None or found.uri is None:
        raise CheckpointRefused(f"{where}: run {run_id} recorded no checkpoint with a location")
    return BaseCheckpoint(uri=found.uri, run_id=run_id, step=found.step)
