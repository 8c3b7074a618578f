"""One local deployment: the pipeline stack in embedded AWS, with the router and DynamoDB in a
process of their own (mtrl/local/router_process.py) and the compute planes as local processes
(the serverless plane's managed job as a thread of this one, mtrl/local/managed_job.py).
`upload` starts a run the way S3 and EventBridge would; `follow` watches its execution to the
end and measures what it left behind."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from domain.bucket import (
    CONFIG_METADATA_KEY,
    CONFIGS_PREFIX,
    TRAJECTORIES_PREFIX,
    run_output_prefix,
    run_outputs,
    trajectories_prefix,
)
from domain.runs import RunStore
from lambdas.pipeline.dependencies import Compute
from lambdas.pipeline.resources import leftover_resources
from lambdas.pipeline.serverless_training import ManagedJobSettings
from lambdas.pipeline.settings import PipelineSettings
from lambdas.pipeline.steps import STEP
from lambdas.pipeline.training_metrics import KeptMetrics
from lambdas.pipeline.training_planes import TrainingPlanes
from lambdas.router.conversations import ConversationStore
from mtrl.local.aws import LocalAws, collector_tuned_for_serving
from mtrl.local.backends import (
    LOCAL_POLICY,
    LocalRewardFleet,
    LocalTrainingCluster,
    TrainerProgram,
)
from mtrl.local.embedded import (
    STAND_IN_PLANES,
    LocalPipeline,
    deploy_pipeline,
    matches,
    upload_event,
)
from mtrl.local.managed_job import LocalJobService, LocalServerlessPlane
from mtrl.local.physical import REGION
from mtrl.local.router_process import RouterProcess
from mtrl.local.waits import PlaneChanges, waits_end_on
from stacks.components.router import CONSUMER_HANDLER
from training_configs.schema import SHIPPED, TrainingConfig, load_training_config

POLL_SECONDS = "1"
CLIENTS = (
    "iam", "dynamodb", "sns", "lambda", "stepfunctions", "s3", "sqs", "cloudwatch", "sagemaker",
)  # fmt: skip


class InjectedFault(RuntimeError):
    """A failure injected into a pipeline state (`mtrl local --inject-fault STATE`)."""


@dataclass
class Prepared:
    """A local run's checked inputs."""

    dataset: Path
    records: int
    config_name: str
    config: TrainingConfig


@dataclass
class Observer:
    """What the terminal shows: called as states are entered and training steps finish."""

    on_state: Callable[[str], None] = lambda state: None
    on_step: Callable[[dict[str, Any], int], None] = lambda metrics, total: None


@dataclass
class RunOutcome:
    run_id: str
    status: str
    error: str | None
    cause: str | None
    states: list[str]
    history: list[dict[str, Any]]
    metrics: list[dict[str, Any]]
    notification: str | None
    teardown: dict[str, Any] | None
    leftover: dict[str, int]
    events: list[dict[str, Any]] = field(default_factory=list)
    config: TrainingConfig | None = None
    seconds: float = 0.0
    evaluation: dict[str, Any] | None = None  # the run's evaluation.json, once Collect wrote it
    health: dict[str, str] = field(default_factory=dict)  # run-health warnings, by metric
    tracking: str | None = None  # the MLflow run it was logged as, or why it was not


def config_upload(prepared: Prepared) -> tuple[str, bytes | None]:
    """The dataset's `mtrl-config` metadata value, and the YAML to upload under that key (None
    when the pipeline knows the config by its shipped name and nothing was overridden)."""
    if prepared.config_name in SHIPPED and prepared.config == load_training_config(
        prepared.config_name
    ):
        return prepared.config_name, None
    text = yaml.safe_dump(prepared.config.model_dump(mode="json"), sort_keys=False)
    return f"{CONFIGS_PREFIX}{prepared.config.name}.yaml", text.encode()


class LocalSession:
    def __init__(
        self,
        template: dict[str, Any],
        *,
        out_dir: Path,
        seed: int = 0,
        trainer: TrainerProgram = LOCAL_POLICY,
    ) -> None:
        self._template = template
        self._trainer = trainer
        self._out_dir = out_dir
        self._seed = seed
        self._stack = contextlib.ExitStack()
        self.aws = LocalAws()
        self._router: RouterProcess
        self.pipeline: LocalPipeline
        self.clients: dict[str, Any] = {}
        self.fleet: LocalRewardFleet
        self.cluster: LocalTrainingCluster
        self.managed_jobs: LocalJobService
        self.planes: TrainingPlanes
        self._execution: str | None = None

    def __enter__(self) -> LocalSession:
        try:
            self._start()
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def _start(self) -> None:
        # Started first: its start overlaps this one's.
        router = self._router = self._stack.enter_context(RouterProcess())
        aws = self._stack.enter_context(self.aws)
        aws.serve_elsewhere("dynamodb", router.ready().dynamodb)
        self.clients = {name: aws.client(name) for name in CLIENTS}
        logs = self._out_dir
        # The planes say when they change; the pipeline's Waits end then (mtrl/local/waits.py).
        changes = PlaneChanges()
        self._stack.enter_context(waits_end_on(changes))
        self.managed_jobs = self._stack.enter_context(
            LocalJobService(
                lambda_client=self.clients["lambda"], s3=self.clients["s3"],
                sagemaker=self.clients["sagemaker"], changes=changes, seed=self._seed,
                region=REGION,
            )
        )  # fmt: skip
        # A serverless run's workers speak to the job's runtime here (in agent mode).
        runtime = {"MTRL_JOB_RUNTIME_URL": self.managed_jobs.runtime_url}
        self.fleet = LocalRewardFleet(
            environment=aws.environment() | runtime, log_dir=logs, changes=changes
        )
        self.training_metrics = KeptMetrics()  # what the dashboard would graph
        self.cluster = LocalTrainingCluster(
            environment=aws.environment(), log_dir=logs, changes=changes, seed=self._seed,
            program=self._trainer,
        )  # fmt: skip
        # Whatever a run leaves running is stopped when the session ends (after it was counted).
        self._stack.callback(self._stop_processes)
        self.pipeline = deploy_pipeline(
            self._template,
            clients=self.clients,
            dispatcher=aws.dispatcher,
            compute=Compute(fleet=lambda: self.fleet, cluster=lambda: self.planes),
            training_metrics=self.training_metrics,
            overrides={
                "POLL_SECONDS": POLL_SECONDS, "ROUTER_URL": router.ready().router,
                **STAND_IN_PLANES,
            },
        )  # fmt: skip
        # The local trainer stands in for both HyperPod planes; the serverless plane is the
        # deployed one, over the local job service.
        serverless = ManagedJobSettings.from_environment(
            {"AWS_REGION": REGION, **self.pipeline.environment}
        )
        self.planes = TrainingPlanes(
            standard=self.cluster, nova=self.cluster,
            serverless=LocalServerlessPlane(
                serverless, service=self.managed_jobs, s3=self.clients["s3"],
                store=ConversationStore(self.clients["dynamodb"], serverless.conversations_table),
            ),
        )  # fmt: skip
        self._stack.enter_context(collector_tuned_for_serving())  # deployed: freeze it
        # The router's proxy and consumer run in the router process (its Function URL is the
        # deployment's ROUTER_URL); the consumer's event source mappings are polled there.
        router.route(
            table=self.pipeline.environment["CONVERSATIONS_TABLE"], sqs_endpoint=aws.endpoint
        )
        aws.mappings.elsewhere[self.pipeline.function(CONSUMER_HANDLER)] = router
        self._inbox = self._subscribe_inbox()

    def _subscribe_inbox(self) -> str:
        """An SQS queue on the alert topic: the run's notification, as a subscriber gets it."""
        sqs = self.clients["sqs"]
        inbox = sqs.create_queue(QueueName="local-notifications")["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=inbox, AttributeNames=["QueueArn"])["Attributes"][
            "QueueArn"
        ]
        self.clients["sns"].subscribe(
            TopicArn=self.pipeline.environment["ALERT_TOPIC_ARN"],
            Protocol="sqs",
            Endpoint=arn,
            Attributes={"RawMessageDelivery": "true"},
        )
        return inbox

    def inject_fault(self, state: str) -> None:
        """Make every invocation of `state`'s Lambda fail while the run is in that state (its
        retries included), as if the function were broken: the run must fail there and still
        end torn down and notified."""
        broken = self.pipeline.state_steps[state]

        def fault(step: str, event: dict[str, Any]) -> None:
            if step == broken and self._current_state() == state:
                raise InjectedFault(f"fault injected into {state}")

        self.pipeline.dispatcher.fault = fault

    def _current_state(self) -> str | None:
        if self._execution is None:
            return None
        entered = [e for e in self._history(self._execution) if "stateEnteredEventDetails" in e]
        latest = max(entered, key=lambda e: e["id"], default=None)
        return latest["stateEnteredEventDetails"]["name"] if latest else None

    def upload(self, prepared: Prepared) -> tuple[str, str]:
        """Upload config and dataset as `mtrl submit` would; start the run as the rule would."""
        s3, bucket = self.clients["s3"], self.pipeline.data_bucket
        config_name, config_body = config_upload(prepared)
        if config_body is not None:
            s3.put_object(Bucket=bucket, Key=config_name, Body=config_body)
        key = f"training-data/{prepared.dataset.name}"
        version = s3.put_object(
            Bucket=bucket,
            Key=key,
            Body=prepared.dataset.read_bytes(),
            Metadata={CONFIG_METADATA_KEY: config_name},
        )["VersionId"]
        event = upload_event(bucket, key, version)
        if not matches(self.pipeline.upload_pattern, event):
            raise RuntimeError(f"the upload rule does not match {key}")
        start = self.pipeline.function(STEP["start_run"].handler)
        started = self.pipeline.dispatcher.call(start, event)
        self._execution = started["execution_arn"]
        return started["run_id"], started["execution_arn"]

    def follow(
        self,
        run_id: str,
        execution: str,
        observer: Observer,
        config: TrainingConfig,
        timeout_seconds: float,
    ) -> RunOutcome:
        sfn = self.clients["stepfunctions"]
        deadline = time.monotonic() + timeout_seconds
        seen_calls, seen_steps = 0, 0
        progress: list[dict[str, Any]] = []
        calls = self.pipeline.dispatcher.invocations
        while True:
            described = sfn.describe_execution(executionArn=execution)
            # The pipeline's steps as they are invoked (the full history is read once, at the
            # end); the router's functions are not steps of the run.
            for step in calls[seen_calls:]:
                if step in STEP:
                    observer.on_state(step)
            seen_calls = len(calls)
            printed = self.cluster.progress.get(run_id, []) + self.managed_jobs.progress[run_id]
            progress = [e for e in printed if "step" in e]
            for metrics in progress[seen_steps:]:
                observer.on_step(metrics, metrics.get("of", config.max_steps))
            seen_steps = len(progress)
            if described["status"] != "RUNNING":
                break
            if time.monotonic() > deadline:
                sfn.stop_execution(
                    executionArn=execution, error="LocalTimeout", cause="mtrl local timed out"
                )
                described = sfn.describe_execution(executionArn=execution)
                break
            time.sleep(0.5)
        history = self._history(execution)
        self._router.save_log(self._out_dir / run_id / "logs" / "router.log")
        seen_states = [
            e["stateEnteredEventDetails"]["name"]
            for e in history
            if "stateEnteredEventDetails" in e
        ]
        return RunOutcome(
            run_id=run_id,
            status=described["status"],
            error=described.get("error"),
            cause=described.get("cause"),
            states=seen_states,
            history=history,
            metrics=[{k: v for k, v in m.items() if k not in ("event", "of")} for m in progress],
            notification=self._notification(),
            teardown=_teardown_result(history),
            leftover=self.leftover(run_id),
            events=sorted(self.fleet.events + self.cluster.events, key=lambda e: e["at"]),
            health=self._health(run_id),
        )

    def _health(self, run_id: str) -> dict[str, str]:
        """The run-health warnings Monitor kept on the run's record."""
        settings = PipelineSettings.model_validate(self.pipeline.environment)
        record = RunStore(self.clients["dynamodb"], settings.runs_table).get(run_id)
        return dict(record.health) if record is not None else {}

    def _history(self, execution: str) -> list[dict[str, Any]]:
        pages = self.clients["stepfunctions"].get_paginator("get_execution_history")
        return [
            event for page in pages.paginate(executionArn=execution) for event in page["events"]
        ]

    def _notification(self) -> str | None:
        """The run's notification (it is published after teardown, as the execution ends)."""
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            messages = (
                self.clients["sqs"]
                .receive_message(QueueUrl=self._inbox, WaitTimeSeconds=1)
                .get("Messages", [])
            )
            if messages:
                return messages[0]["Body"]
        return None

    def download_outputs(self, run_id: str, directory: Path) -> list[Path]:
        """Copy what the run wrote under `runs/<run_id>/`, and its trajectories (from
        `trajectories/<run_id>/`) into a `trajectories/` folder beside them (the embedded S3
        ends with the session)."""
        s3, bucket = self.clients["s3"], self.pipeline.data_bucket
        saved = []
        for prefix, folder in (
            (run_output_prefix(run_id), directory),
            (trajectories_prefix(run_id), directory / TRAJECTORIES_PREFIX),
        ):
            for key in run_outputs(s3, bucket=bucket, prefix=prefix):
                target = folder / key
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(
                    s3.get_object(Bucket=bucket, Key=f"{prefix}{key}")["Body"].read()
                )
                saved.append(target)
        return saved

    def restore_outputs(self, run_id: str, directory: Path) -> int:
        """Put a previous local run's outputs (as `download_outputs` saved them) back under
        `runs/<run_id>/`, where a deployment keeps them: a run can then start from its checkpoint.
        Its trajectories stay in the folder: nothing a run reads is among them. Returns how many
        objects."""
        s3, prefix = self.clients["s3"], run_output_prefix(run_id)
        kept = directory / TRAJECTORIES_PREFIX
        files = sorted(
            path for path in directory.rglob("*") if path.is_file() and kept not in path.parents
        )
        for path in files:
            key = f"{prefix}{path.relative_to(directory).as_posix()}"
            s3.put_object(Bucket=self.pipeline.data_bucket, Key=key, Body=path.read_bytes())
        return len(files)

    def leftover(self, run_id: str) -> dict[str, int]:
        """What of the run still exists: AWS resources, processes, event source pollers."""
        settings = PipelineSettings.model_validate(self.pipeline.environment)
        return {
            "resources": leftover_resources(
                settings.router_wiring(lambda service: self.clients[service]),
                run_id=run_id,
            ),
            "processes": self.fleet.alive() + self.cluster.alive() + self.managed_jobs.alive(),
            "pollers": self.aws.mappings.active,
        }

    def _stop_processes(self) -> None:
        for process_group in (self.fleet, self.cluster, self.managed_jobs):
            process_group.kill_all()


def _teardown_result(history: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The result of the last teardown (on the success or the failure path), from the history."""
    in_teardown, result = False, None
    for event in history:
        if "stateEnteredEventDetails" in event:
            in_teardown = event["stateEnteredEventDetails"]["name"].startswith("Teardown")
        details = event.get("lambdaFunctionSucceededEventDetails") or event.get(
            "taskSucceededEventDetails"
        )
        if in_teardown and details:
            result = json.loads(details["output"])
    return result
