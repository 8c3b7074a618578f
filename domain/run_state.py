"""A run's state between the pipeline's steps: what the state machine carries from one Lambda
to the next (its input, and each step's result at its path), as typed models. Each step parses
the state once; each step that adds to it returns one of these, serialized."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from domain.backends import Phase
from domain.checkpoints import BaseCheckpoint
from domain.episodes import EvaluationStage
from training_configs.schema import TrainingConfig


class RegisteredRun(BaseModel):
    """Register's result, at `$.run`."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    poll_seconds: int
    created: bool
    config: TrainingConfig
    cost_per_hour: float
    deadline_at: float
    base: BaseCheckpoint | None = None  # the checkpoint the run starts from


class RunResources(BaseModel):
    """Provision's result, at `$.resources`: the run's queues by kind, its alarms, and the
    rollout Lambda its Nova jobs invoke (their `rollout_request_arn`; None for another trainer)."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    queues: dict[str, str]
    alarms: list[str]
    rollout_request_arn: str | None = None


class JobReport(BaseModel):
    """Monitor's result, at `$.job`: the job's phase (the `JobDone?` choice reads it), or the
    pipeline's reason to stop the run; the training step seen, and for how many polls."""

    model_config = ConfigDict(frozen=True)

    phase: Phase
    reason: str = ""
    step: int | None = None
    quiet_polls: int = 0
    health: list[str] = []  # run-health warnings that hold (rules with action `warn`)
    published_step: int | None = None  # the last step whose figures went to the dashboard


class EvaluationJob(BaseModel):
    """An evaluation's state, at `$.evaluations.<stage>`: submitted (its job) or skipped (why);
    `ready` once it ended (the poll's choice reads it), with its headline figures then."""

    model_config = ConfigDict(frozen=True)

    stage: EvaluationStage
    job: str | None = None
    skipped: str | None = None
    ready: bool = False
    phase: Phase | None = None
    n: int | None = None
    mean_reward: float | None = None
    pass_at_1: float | None = None


class OpenedPhase(BaseModel):
    """OpenPhase's result, at `$.opened`: the phase of the run now open, how many of its queues
    were emptied of the phase before, and how long to wait before the phase's job starts (SQS
    may take that long to delete what a purge removes)."""

    model_config = ConfigDict(frozen=True)

    phase: Literal["baseline", "training", "final"]
    purged: int = 0
    wait_seconds: int = 0


class RunState(BaseModel):
    """The execution's state as a step receives it whole: the upload it started with, and what
    the steps before it added (absent before they ran: a failure before Register has no run)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    bucket: str
    key: str
    version_id: str | None = None
    run: RegisteredRun | None = None
    resources: RunResources | None = None
    job: JobReport | None = None
    evaluations: dict[EvaluationStage, EvaluationJob] = {}

    @property
    def registered(self) -> RegisteredRun:
        if self.run is None:
            raise ValueError(f"s3://{self.bucket}/{self.key}: the run was never registered")
        return self.run
