"""The two expensive planes behind one small interface each.

The pipeline's compute steps only talk to these: `RewardFleet` (ECS Fargate on AWS, local
processes in local mode) and `TrainingCluster` (HyperPod on AWS, the local trainer in local
mode). Which implementation serves is decided where the steps are composed
(lambdas/pipeline/composition.py for the deployed ones; local mode gives its own).
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from domain.bucket import object_exists
from domain.checkpoints import BaseCheckpoint
from domain.episodes import EvaluationStage
from domain.run_queues import QueueKind
from domain.serverless_job import ServiceOutput
from domain.step_metrics import metrics_lines
from training_configs.schema import TrainingConfig


class Phase(StrEnum):
    """A run's job as Monitor reports it: what the training cluster says of the job, and the
    pipeline's own reasons to stop a run. The state machine's `JobDone?` choice reads these."""

    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    PENDING_TOO_LONG = "pending_too_long"
    STALLED = "stalled"
    PAST_DEADLINE = "past_deadline"
    OVER_BUDGET = "over_budget"
    UNHEALTHY = "unhealthy"  # a run-health rule with action `stop` held (domain/health.py)


# The job goes on: Monitor polls again.
WAITING = (Phase.PENDING, Phase.RUNNING)
# A trainer's progress, one JSON object per finished step (with "step"), under the run's output
# prefix: what a backend reads to tell a stalled job from a slow one.
METRICS_OBJECT = "metrics.jsonl"


@dataclass(frozen=True)
class RunContext:
    """What a backend needs to know about the run it serves."""

    run_id: str
    queues: dict[str, str]
    router_url: str | None
    run_token: str
    bucket: str
    dataset_key: str
    dataset_version: str | None
    output_prefix: str
    # The rollout Lambda a Nova trainer invokes for this run (Provision's alias).
    rollout_request_arn: str | None = None
    # What the run was registered with; None when only tearing down (the reaper knows the run's
    # record, not its state).
    config: TrainingConfig | None = None
    # The checkpoint the run starts from (its config's base_checkpoint, resolved by Register).
    base: BaseCheckpoint | None = None

    @property
    def training(self) -> TrainingConfig:
        if self.config is None:
            raise ValueError(f"run {self.run_id}: no training config in this context")
        return self.config


def worker_environment(run: RunContext) -> dict[str, str]:
    """The reward workers' MTRL_* settings for a run (reward_envs/worker/settings.py), without
    the run token: each fleet hands that over its own way."""
    config = run.training
    values = {
        "MTRL_ROLLOUT_REQUEST_QUEUE_URL": run.queues[QueueKind.ROLLOUT_REQUESTS],
        "MTRL_DEAD_LETTER_QUEUE_URL": run.queues[QueueKind.DLQ],
        "MTRL_ROUTER_URL": run.router_url or "",
        "MTRL_RUN_ID": run.run_id,
        "MTRL_ENVIRONMENT": config.environment,
        "MTRL_ENVIRONMENT_ARGS": json.dumps(config.environment_args)
        if config.environment_args
        else "",
        "MTRL_CONCURRENCY": str(config.rollout_concurrency),
        "MTRL_ROLLOUT_TIMEOUT_SECONDS": str(config.rollout_timeout_seconds),
        "MTRL_MAX_TURNS": str(config.max_turns),
        # The trajectory store: every finished rollout under trajectories/<run_id>/.
        "MTRL_TRAJECTORY_BUCKET": run.bucket if config.trajectories else "",
        "MTRL_CONFIG_HASH": config.fingerprint,
    }
    if config.plane == "serverless":  # the managed job's requests, reported to its runtime
        values |= {"MTRL_AGENT_RFT": "true", "MTRL_MAX_LENGTH": str(config.max_length)}
    return {key: value for key, value in values.items() if value}


class EvaluationUnsupported(RuntimeError):
    """The training plane cannot evaluate a model (yet); the message says why. The run goes on
    and its evaluation report says so."""


@dataclass(frozen=True)
class JobStatus:
    phase: Phase
    reason: str = ""
    step: int | None = None


class RewardFleet(ABC):
    @abstractmethod
    def start(self, run: RunContext, *, workers: int) -> list[str]:
        """Start `workers` reward workers for the run; returns their ids (idempotent per run)."""

    @abstractmethod
    def healthy(self, run: RunContext) -> int:
        """How many of the run's workers are up."""

    @abstractmethod
    def stop(self, run: RunContext) -> int:
        """Stop every worker of the run (idempotent); returns how many were still running."""


class TrainingCluster(ABC):
    @abstractmethod
    def scale_up(self, run: RunContext, *, instances: int) -> None:
        """Ask for `instances` nodes for the run (no-op when they are there)."""

    @abstractmethod
    def nodes_ready(self, run: RunContext) -> int:
        """How many schedulable nodes the run has."""

    @abstractmethod
    def submit(self, run: RunContext) -> str:
        """Submit the run's training job with its config (idempotent: a resubmission returns
        the same job)."""

    @abstractmethod
    def status(self, run: RunContext) -> JobStatus:
        """Where the run's job is, with the reason when it failed or waits too long."""

    @abstractmethod
    def submit_evaluation(self, run: RunContext, *, stage: EvaluationStage) -> str:
        """Submit the evaluation of the run's starting (`baseline`) or trained (`final`) model
        on its held-out records (domain/evaluation.py): its episodes, one JSON line each, go to
        `episodes_key(run.output_prefix, stage)`. Idempotent per run and stage. Raises
        EvaluationUnsupported where the plane cannot evaluate."""

    @abstractmethod
    def evaluation_status(self, run: RunContext, *, stage: EvaluationStage) -> JobStatus:
        """Where the run's evaluation of `stage` is."""

    @abstractmethod
    def delete(self, run: RunContext) -> int:
        """Delete every object of the run's jobs, its evaluations' too (idempotent); returns
        how many existed."""

    def managed_job_output(self, run: RunContext) -> ServiceOutput | None:
        """What the run's job reported of itself, where AWS manages it: the model package it
        registered (once it ended), the tokens billed, its MLflow run; None where the plane
        leaves its checkpoints to Collect to register."""
        return None

    @abstractmethod
    def scale_down(self, run: RunContext) -> None:
        """Release the run's nodes unless another run still needs them."""

    @abstractmethod
    def release_idle(self, *, immediately: bool = False) -> bool:
        """Release nodes kept warm that no run took within the keep-warm period — or, with
        `immediately`, any nodes no run holds now (True if it released any)."""


def last_step(s3: Any, *, bucket: str, key: str) -> int | None:
    """The last step a trainer recorded in its metrics object (None before the first)."""
    metrics = last_metrics(s3, bucket=bucket, key=key)
    return metrics["step"] if metrics else None


def last_metrics(s3: Any, *, bucket: str, key: str) -> dict[str, Any] | None:
    """The last step's metrics a trainer recorded."""
    recent = recent_metrics(s3, bucket=bucket, key=key, tail_bytes=8192)
    return recent[-1] if recent else None


def recent_metrics(
    s3: Any, *, bucket: str, key: str, tail_bytes: int = 256 * 1024
) -> list[dict[str, Any]]:
    """The last steps' metrics a trainer recorded, in order, read from the object's tail only:
    it grows by a line a step for the whole run."""
    if not object_exists(s3, bucket=bucket, key=key):
        return []
    body = s3.get_object(Bucket=bucket, Key=key, Range=f"bytes=-{tail_bytes}")["Body"].read()
    return metrics_lines(body.decode("utf-8", errors="replace"))
