"""A run's state between the pipeline's steps: what the state machine carries from one Lambda
to the next (its input, and each step's result at its path), as typed models. Each step's
Lambda parses its event into the model its body takes and serializes the model it returns
(lambdas/pipeline/composition.py `at_the_boundary`); the state machine's paths and choices
(stacks/components/pipeline_states.py) read the fields named here."""

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


class ProvisionRequest(BaseModel):
    """Provision's input: Register's result."""

    model_config = ConfigDict(frozen=True)

    run: RegisteredRun


class PhaseRequest(BaseModel):
    """OpenPhase's input: the phase to open, and the state."""

    model_config = ConfigDict(frozen=True)

    phase: Literal["baseline", "training", "final"]
    state: RunState


class EvaluationRequest(BaseModel):
    """StartEvaluation's and EvaluationStatus's input: the stage, and the state."""

    model_config = ConfigDict(frozen=True)

    stage: EvaluationStage
    state: RunState


class CollectRequest(BaseModel):
    """Collect's input: the state, and the execution (the model package says what made it)."""

    model_config = ConfigDict(frozen=True)

    state: RunState
    execution_arn: str


class RunRef(BaseModel):
    """Teardown's input: the run, by id (all it needs: every per-run resource is named by it)."""

    model_config = ConfigDict(frozen=True)

    run_id: str


class TornDown(BaseModel):
    """Teardown's result, at `$.teardown`: the queues it deleted and what of the run is left."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    queues_deleted: int
    leftover: int


class RunEnd(BaseModel):
    """NotifyEnd's input: how the run ended, what teardown left, its evaluation's headline and
    the held-out check's warning (the failure path has no evaluation)."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    succeeded: bool = False
    failed_state: str | None = None
    error: str | None = None  # a Lambda error's cause, as Step Functions caught it
    teardown: TornDown | None = None
    evaluation: str | None = None
    caution: str | None = None


class RunNotice(BaseModel):
    """NotifyEnd's result, at `$.notification`: the run's end as its notification tells it. A
    run the pipeline never registered (its dataset was invalid) has only its id, status, where
    it failed and its teardown; `message_id`: the SNS message's, where the deployment alerts."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    status: Literal["SUCCEEDED", "FAILED"]
    dataset: str | None = None
    config: str | None = None
    duration_hours: float | None = None
    cost_estimate_usd: float | None = None
    results: str | None = None
    failed_state: str | None = None
    error: str | None = None
    teardown: TornDown | None = None
    evaluation: str | None = None  # the held-out evaluation's headline
    health: list[str] = []
    notes: list[str] = []
    tracking: str | None = None  # the MLflow run it was logged as, or why it was not
    message_id: str | None = None


class StartedRun(BaseModel):
    """StartRun's result: the execution of the upload's run (already finished: a duplicate)."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    execution_arn: str
    already_finished: bool


class Validation(BaseModel):
    """Validate's result, at `$.validation`: the records counted and the report's key."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    records: int
    report_key: str


class ScaledUp(BaseModel):
    """ScaleUp's result, at `$.scaled`."""

    model_config = ConfigDict(frozen=True)

    instances: int
    scale_to_zero: bool


class NodesReady(BaseModel):
    """NodesReady's result, at `$.nodes` (the poll's choice reads `ready`)."""

    model_config = ConfigDict(frozen=True)

    ready: bool
    nodes: int


class WorkersStarted(BaseModel):
    """StartWorkers' result, at `$.workers`."""

    model_config = ConfigDict(frozen=True)

    workers: int


class WorkersHealthy(BaseModel):
    """WorkersHealthy's result, at `$.fleet` (the poll's choice reads `ready`)."""

    model_config = ConfigDict(frozen=True)

    ready: bool
    healthy: int


class SubmittedJob(BaseModel):
    """SubmitJob's result, at `$.submitted`: the job's name."""

    model_config = ConfigDict(frozen=True)

    job: str


class Collected(BaseModel):
    """Collect's result, at `$.results`: where the results are, how many objects, the
    evaluation's headline and the held-out check's warning (NotifySuccess tells both)."""

    model_config = ConfigDict(frozen=True)

    results: str
    objects: int
    evaluation: str | None
    caution: str | None


class Released(BaseModel):
    """ReleaseCompute's result, at `$.released`."""

    model_config = ConfigDict(frozen=True)

    workers_stopped: int
    job_objects_deleted: int


class ReleasedIdle(BaseModel):
    """ReleaseIdle's result: whether nodes kept warm were scaled to zero."""

    model_config = ConfigDict(frozen=True)

    released: bool


class ReapRequest(BaseModel):
    """What the reaper is asked: nothing (its schedule: every overdue or orphaned run), one run
    to tear down now (`mtrl teardown RUN`), or idle GPU nodes to release (`--all-idle`)."""

    model_config = ConfigDict(extra="ignore")  # a scheduled event carries EventBridge's fields

    run_id: str | None = None
    release_idle: bool = False


class Reaped(BaseModel):
    """A run the reaper tore down: why, and what releasing its compute and tearing down its
    router resources did."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    reason: str
    workers_stopped: int
    job_objects_deleted: int
    queues_deleted: int
    leftover: int


class ReapLater(BaseModel):
    """A run whose compute could not be released yet: the next schedule tries it again."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    error: str


class ReapResult(BaseModel):
    """The reaper's answer, which `mtrl teardown` reads: the runs it tore down and those it
    will try again; `unknown`, the run asked for when there is none; `released_idle`, whether
    idle nodes were scaled to zero when that was asked."""

    model_config = ConfigDict(frozen=True)

    reaped: list[Reaped] = []
    retry: list[ReapLater] = []
    unknown: str | None = None
    released_idle: bool | None = None
