"""The pipeline's steps, declared once: what each is, what triggers it, how long it may take,
what it needs in AWS, and whether any error of it is worth retrying. From this table:
`lambdas.pipeline.handlers.<name>` is each step's Lambda entry (handlers.py), its body is the
method of its name on a step class (composition.py), the pipeline construct makes one function
per step and the access table grants its needs (stacks/components/pipeline.py, access.py), the
state machine's tasks retry as declared (pipeline_states.py), and local mode and the IAM proof
find the functions by name. Adding a step: an entry here, its method, and its state.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from domain.needs import Need

HANDLERS = "lambdas.pipeline.handlers"


class Trigger(Enum):
    STATE_MACHINE = "a state of the pipeline's state machine"
    UPLOAD = "the upload rule (EventBridge)"
    SCHEDULE = "a schedule (EventBridge)"


@dataclass(frozen=True)
class PipelineStep:
    name: str
    description: str
    needs: tuple[Need, ...]
    trigger: Trigger = Trigger.STATE_MACHINE
    timeout_seconds: int = 120
    memory_mb: int = 512
    construct_id: str | None = None  # default: the name in CamelCase + "Function"
    # Idempotent clean-up: a state running it retries any error a few times, not only throttling.
    retried_on_any_error: bool = False

    @property
    def handler(self) -> str:
        return f"{HANDLERS}.{self.name}"

    @property
    def id(self) -> str:
        return self.construct_id or f"{self.name.title().replace('_', '')}Function"

    @property
    def calls_kubernetes(self) -> bool:
        """Runs where the EKS API's private endpoint is (the cluster's network)."""
        return Need.KUBERNETES in self.needs

    @property
    def knows_state_machine(self) -> bool:
        """Starts or inspects executions: it is told the state machine's ARN."""
        return bool({Need.EXECUTION_START, Need.EXECUTIONS_STOP} & set(self.needs))


_TEARDOWN = (
    Need.CONVERSATIONS_GET,
    Need.CONVERSATIONS_DELETE,
    Need.CONSUMER_DISCONNECT,
    Need.RUN_QUEUES_DELETE,
    Need.QUEUE_ALARMS_DELETE,
)
_RELEASE = (
    Need.FLEET_STOP,
    Need.NOVA_LAUNCH,
    Need.MANAGED_JOB_STOP,
    Need.KUBERNETES,
    Need.POD_IDENTITY_DELETE,
    Need.NODES_SCALE,
    Need.CAPACITY_LEASES,
)
_RELEASE_IDLE = (Need.NODES_SCALE, Need.CAPACITY_LEASES, Need.CAPACITY_LEASES_READ)

STEPS = (
    PipelineStep(
        "validate", "Validates the uploaded dataset, streaming, with a line-numbered report",
        (Need.DATASETS_READ, Need.OUTPUTS_WRITE), timeout_seconds=900, memory_mb=1024,
    ),
    # RUNS_GET: a retried Register finds the run its first attempt stored; OUTPUTS_*: the summary
    # of the run a config's base_checkpoint names.
    PipelineStep(
        "register", "Registers the run: id, training config, cost and budget check",
        (
            Need.DATASETS_READ, Need.CONFIGS_READ, Need.RUNS_PUT, Need.RUNS_GET,
            Need.OUTPUTS_LIST, Need.OUTPUTS_READ,
        ),
    ),
    # CONVERSATIONS_UPDATE: a Nova run takes the rollout Lambda's lease.
    PipelineStep(
        "provision", "Creates the run's queues, alarms, router entry and (Nova) rollout lease",
        (
            Need.RUN_QUEUES_CREATE, Need.QUEUE_ALARMS_CREATE, Need.CONSUMER_CONNECT,
            Need.CONVERSATIONS_UPDATE,
        ),
    ),
    PipelineStep(
        "teardown", "Deletes every per-run resource (idempotent)", _TEARDOWN,
        retried_on_any_error=True,
    ),
    PipelineStep(
        "notify_end", "Publishes how the run ended (and logs it to MLflow, where deployed)",
        # OUTPUTS_*: what the run did without (its recipes' skipped keys, skipped evaluations).
        (
            Need.RUNS_GET, Need.RUNS_PUT, Need.ALERTS_PUBLISH, Need.EXPERIMENTS_LOG,
            Need.OUTPUTS_LIST, Need.OUTPUTS_READ,
        ),
    ),
    PipelineStep(
        "scale_up", "Asks the training cluster for the run's nodes",
        (Need.NODES_SCALE, Need.CAPACITY_LEASES),
    ),
    PipelineStep(
        "nodes_ready", "Counts the run's schedulable nodes", (Need.NODES_COUNT, Need.KUBERNETES)
    ),
    PipelineStep(
        "start_workers", "Starts the run's reward workers with a fresh run token",
        (Need.CONVERSATIONS_PUT, Need.FLEET_START),
    ),
    PipelineStep("workers_healthy", "Counts the run's healthy reward workers", (Need.FLEET_WATCH,)),
    PipelineStep(
        "open_phase", "Opens a phase of the run (an evaluation, training): empties its queues",
        (Need.CONVERSATIONS_UPDATE, Need.RUN_QUEUES_PURGE),
    ),
    # DATASETS_READ, OUTPUTS_WRITE: a Nova or managed job trains on the dataset without its
    # held-out records.
    PipelineStep(
        "submit_job", "Submits the run's training job (idempotent)",
        (
            Need.KUBERNETES, Need.POD_IDENTITY_CREATE, Need.NOVA_LAUNCH, Need.FORGE_RECIPES_READ,
            Need.DATASETS_READ, Need.OUTPUTS_WRITE, Need.MANAGED_JOB_START,
        ),
    ),
    # A Nova evaluation: AWS's recipe, the held-out records written for it, the checkpoint found.
    # An open-weights one: the trainer image's evaluation job, submitted as the training job is.
    # A serverless one: AWS's evaluation job, of the package the training job registered.
    PipelineStep(
        "start_evaluation", "Starts the evaluation of the run's starting or trained model",
        (
            Need.NOVA_LAUNCH, Need.FORGE_RECIPES_READ, Need.DATASETS_READ,
            Need.EVALUATION_DATA_READ, Need.OUTPUTS_LIST, Need.OUTPUTS_READ, Need.OUTPUTS_WRITE,
            Need.KUBERNETES, Need.POD_IDENTITY_CREATE, Need.MANAGED_EVALUATION_START,
        ),
    ),
    # A Nova or serverless evaluation's episodes: its rollout reports, written beside the run's
    # outputs.
    PipelineStep(
        "evaluation_status", "Polls an evaluation; its headline figures once it ended",
        (
            Need.OUTPUTS_LIST, Need.OUTPUTS_READ, Need.OUTPUTS_WRITE, Need.KUBERNETES,
            Need.CONVERSATIONS_QUERY, Need.MANAGED_EVALUATION_WATCH,
        ),
    ),
    PipelineStep(
        "monitor", "Polls the job; stops runs past their deadline or budget, or unhealthy",
        # A Nova run's reward curve: its rollout reports into its metrics object. Run-health
        # warnings: kept on the run's record, alerted once.
        (
            Need.RUNS_GET, Need.RUNS_PUT, Need.OUTPUTS_LIST, Need.OUTPUTS_READ, Need.OUTPUTS_WRITE,
            Need.KUBERNETES, Need.CONVERSATIONS_QUERY, Need.ALERTS_PUBLISH, Need.MANAGED_JOB_WATCH,
        ),
    ),
    PipelineStep(
        "collect", "Writes the run's evaluation report and summary, registers its model",
        # MANAGED_JOB_WATCH: the model package a serverless run's job registered.
        (
            Need.OUTPUTS_LIST, Need.OUTPUTS_READ, Need.OUTPUTS_WRITE, Need.MODELS_REGISTER,
            Need.MANAGED_JOB_WATCH,
        ),
    ),
    PipelineStep(
        "release_compute", "Stops workers, deletes the job, scales nodes down (idempotent)",
        _RELEASE, retried_on_any_error=True,
    ),
    PipelineStep(
        "start_run", "Starts the pipeline for an upload, named after the run (idempotent)",
        (Need.EXECUTION_START,), trigger=Trigger.UPLOAD, timeout_seconds=30,
        construct_id="StartRun",
    ),
    # Every 15 minutes; also on request: one run now (`mtrl teardown RUN`), or idle nodes
    # (`mtrl teardown --all-idle`).
    PipelineStep(
        "reap", "Tears down runs past their deadline or whose execution is gone",
        (
            Need.RUNS_SCAN, Need.RUNS_GET, Need.RUNS_PUT, Need.EXECUTIONS_STOP,
            *_RELEASE, *_RELEASE_IDLE, *_TEARDOWN,
        ),
        trigger=Trigger.SCHEDULE, timeout_seconds=300, construct_id="Reaper",
    ),
    # Only with `keep_warm_minutes`: every 5 minutes.
    PipelineStep(
        "release_idle", "Scales GPU nodes kept warm to zero once no run took them",
        _RELEASE_IDLE, trigger=Trigger.SCHEDULE,
    ),
)  # fmt: skip
STEP = {step.name: step for step in STEPS}
