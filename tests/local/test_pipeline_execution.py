"""The synthesized state machine, executed by moto's Step Functions interpreter with the real
handlers dispatched in-process: happy path, invalid dataset, duplicate event, and a fault in
every state — each ends with nothing left, a notification, and the right final status."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

import boto3
import pytest
from moto import mock_aws

from domain.backends import (
    EvaluationUnsupported,
    JobStatus,
    RewardFleet,
    RunContext,
    TrainingCluster,
)
from domain.episodes import EvaluationStage
from lambdas.pipeline.dependencies import Compute
from lambdas.pipeline.steps import STEP
from mtrl.local.embedded import (
    REGION,
    STAND_IN_PLANES,
    LocalPipeline,
    deploy_pipeline,
    in_process_lambdas,
    matches,
    upload_event,
)
from tests.conftest import Synthesized
from tests.executions import finished


class FakeFleet(RewardFleet):
    """Records what the pipeline asks; workers come up at once."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.running: dict[str, int] = {}

    def start(self, run: RunContext, *, workers: int) -> list[str]:
        self.calls.append("start")
        assert run.run_token and run.queues["rollout_requests"]
        self.running[run.run_id] = workers
        return [f"{run.run_id}-w{i}" for i in range(workers)]

    def healthy(self, run: RunContext) -> int:
        return self.running.get(run.run_id, 0)

    def stop(self, run: RunContext) -> int:
        self.calls.append("stop")
        return self.running.pop(run.run_id, 0)


class FakeCluster(TrainingCluster):
    """Nodes ready on the second poll; the job goes through `phases`; each evaluation through
    `evaluations`, or none can run (None)."""

    def __init__(self, phases: list[JobStatus]) -> None:
        self.calls: list[str] = []
        self.phases = phases
        self.polls = 0
        self.evaluations: list[JobStatus] | None = None

    def scale_up(self, run: RunContext, *, instances: int) -> None:
        self.calls.append(f"scale_up:{instances}")

    def nodes_ready(self, run: RunContext) -> int:
        self.polls += 1
        return 0 if self.polls == 1 else 8  # the example config's nodes

    def submit(self, run: RunContext) -> str:
        self.calls.append("submit")
        return f"job-{run.run_id}"

    def status(self, run: RunContext) -> JobStatus:
        return self.phases.pop(0) if len(self.phases) > 1 else self.phases[0]

    def submit_evaluation(self, run: RunContext, *, stage: EvaluationStage) -> str:
        self.calls.append(f"evaluate:{stage}")
        if self.evaluations is None:
            raise EvaluationUnsupported("this plane cannot evaluate")
        return f"{run.run_id}-{stage}"

    def evaluation_status(self, run: RunContext, *, stage: EvaluationStage) -> JobStatus:
        assert self.evaluations is not None, "a skipped evaluation is not polled"
        return self.evaluations.pop(0) if len(self.evaluations) > 1 else self.evaluations[0]

    def delete(self, run: RunContext) -> int:
        self.calls.append("delete")
        return 3

    def scale_down(self, run: RunContext) -> None:
        self.calls.append("scale_down")

    def release_idle(self, *, immediately: bool = False) -> bool:
        return False


@pytest.fixture
def compute() -> Iterator[tuple[FakeFleet, FakeCluster]]:
    fleet, cluster = (
        FakeFleet(),
        FakeCluster(
            [JobStatus("pending"), JobStatus("running", step=1), JobStatus("succeeded", step=2)]
        ),
    )
    yield fleet, cluster


GOOD = b"".join(
    json.dumps({"id": f"w{i}", "metadata": {"prompt": "Play.", "answer": "crane"}}).encode() + b"\n"
    for i in range(3)
)


@pytest.fixture
def local(
    default_app: Synthesized, monkeypatch: pytest.MonkeyPatch, compute: tuple
) -> Iterator[tuple[LocalPipeline, dict]]:
    fleet, cluster = compute
    planes = Compute(fleet=lambda: fleet, cluster=lambda: cluster)
    with deployed_pipeline(default_app, monkeypatch, compute=planes) as deployed:
        yield deployed


@contextmanager
def deployed_pipeline(
    app: Synthesized, monkeypatch: pytest.MonkeyPatch, *, compute: Compute
) -> Iterator[tuple[LocalPipeline, dict]]:
    """The pipeline stack in moto with its state machine executing on `compute`, and an `inbox`
    queue subscribed to the alert topic."""
    for key, value in {
        "AWS_DEFAULT_REGION": REGION,
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
    }.items():
        monkeypatch.setenv(key, value)
    config = {"stepfunctions": {"execute_state_machine": True}, "lambda": {"use_docker": False}}
    with mock_aws(config=config), in_process_lambdas() as dispatcher:
        clients = {
            name: boto3.client(name)
            for name in ("iam", "dynamodb", "sns", "lambda", "stepfunctions", "s3", "sqs", "cloudwatch",
                         "sagemaker")
        }  # fmt: skip
        pipeline = deploy_pipeline(
            app.template("pipeline"),
            clients=clients,
            dispatcher=dispatcher,
            compute=compute,
            overrides={"POLL_SECONDS": "0", **STAND_IN_PLANES},
        )
        inbox = clients["sqs"].create_queue(QueueName="inbox")["QueueUrl"]
        inbox_arn = clients["sqs"].get_queue_attributes(
            QueueUrl=inbox, AttributeNames=["QueueArn"]
        )["Attributes"]["QueueArn"]
        clients["sns"].subscribe(
            TopicArn=pipeline.environment["ALERT_TOPIC_ARN"],
            Protocol="sqs",
            Endpoint=inbox_arn,
            Attributes={"RawMessageDelivery": "true"},
        )
        clients["inbox"] = inbox
        yield pipeline, clients


def _upload(pipeline: LocalPipeline, clients: dict, key: str, body: bytes) -> dict:
    version = clients["s3"].put_object(Bucket=pipeline.data_bucket, Key=key, Body=body)["VersionId"]
    event = upload_event(pipeline.data_bucket, key, version)
    assert matches(pipeline.upload_pattern, event)
    return pipeline.dispatcher.call(pipeline.function(STEP["start_run"].handler), event)


def _notifications(clients: dict) -> list[str]:
    return [
        m["Body"]
        for m in clients["sqs"]
        .receive_message(QueueUrl=clients["inbox"], MaxNumberOfMessages=10)
        .get("Messages", [])
    ]


def _run_queues(clients: dict) -> list[str]:
    return [url for url in clients["sqs"].list_queues().get("QueueUrls", []) if "nova-mtrl-" in url]


def test_the_rule_takes_only_jsonl_under_training_data(local) -> None:
    pipeline, _ = local
    assert matches(
        pipeline.upload_pattern, upload_event(pipeline.data_bucket, "training-data/a/b.jsonl", "v")
    )
    assert not matches(
        pipeline.upload_pattern, upload_event(pipeline.data_bucket, "training-data/readme.txt", "v")
    )
    assert not matches(
        pipeline.upload_pattern, upload_event(pipeline.data_bucket, "runs/x/report.jsonl", "v")
    )
    assert not matches(
        pipeline.upload_pattern, upload_event("another-bucket", "training-data/a.jsonl", "v")
    )


def test_a_valid_upload_runs_to_success_and_leaves_nothing(local, compute) -> None:
    pipeline, clients = local
    fleet, cluster = compute
    started = _upload(pipeline, clients, "training-data/wordle.jsonl", GOOD)
    described = finished(clients["stepfunctions"], started["execution_arn"])
    assert described["status"] == "SUCCEEDED", described
    assert pipeline.dispatcher.invocations == [
        "start_run", "validate", "register", "provision", "scale_up", "nodes_ready", "nodes_ready", "start_workers",
        "workers_healthy", "open_phase", "start_evaluation", "open_phase", "submit_job", "monitor",
        "monitor", "monitor", "open_phase", "start_evaluation", "collect", "release_compute",
        "teardown", "notify_end",
    ]  # fmt: skip
    assert cluster.calls == [
        "scale_up:8", "evaluate:baseline", "submit", "evaluate:final", "delete", "scale_down",
    ]  # fmt: skip
    assert fleet.calls == ["start", "stop"]
    assert _run_queues(clients) == []
    (notice,) = _notifications(clients)
    assert notice.startswith(f"nova-mtrl run {started['run_id']} SUCCEEDED")
    output = json.loads(described["output"])
    assert output["teardown"]["leftover"] == 0
    # The last phase opened, with no wait on moto; training opened within the minute, so its
    # purge is the one that counts (moto refuses a second, as SQS does).
    assert output["opened"] == {"phase": "final", "purged": 0, "wait_seconds": 0}
    # A plane that cannot evaluate: both evaluations skipped with its reason, and reported so.
    assert output["evaluations"]["baseline"]["skipped"] == "this plane cannot evaluate"
    report = json.loads(
        clients["s3"]
        .get_object(Bucket=pipeline.data_bucket, Key=f"runs/{started['run_id']}/evaluation.json")[
            "Body"
        ]
        .read()
    )
    assert report["baseline"] is None and report["skipped"] == {
        "baseline": "this plane cannot evaluate",
        "final": "this plane cannot evaluate",
    }


def test_the_evaluations_are_polled_until_done_and_a_failed_one_fails_the_run(
    local, compute
) -> None:
    pipeline, clients = local
    fleet, cluster = compute
    cluster.evaluations = [
        JobStatus("pending"),
        JobStatus("running"),
        JobStatus("failed", "evaluator exited with code 1: no final checkpoint"),
    ]
    started = _upload(pipeline, clients, "training-data/w.jsonl", GOOD)
    described = finished(clients["stepfunctions"], started["execution_arn"])
    assert described["status"] == "FAILED" and described["error"] == "EvaluationFailed"
    assert "the baseline evaluation ended failed: evaluator exited" in described["cause"]
    invocations = pipeline.dispatcher.invocations
    assert invocations.count("evaluation_status") == 3 and "submit_job" not in invocations
    assert invocations[-3:] == ["release_compute", "teardown", "notify_end"]
    assert cluster.calls[-2:] == ["delete", "scale_down"] and _run_queues(clients) == []
    (notice,) = _notifications(clients)
    assert "failed in BaselineEvaluation: EvaluationFailed: the baseline evaluation" in notice


def test_a_duplicate_event_is_one_run(local) -> None:
    pipeline, clients = local
    version = clients["s3"].put_object(
        Bucket=pipeline.data_bucket, Key="training-data/w.jsonl", Body=GOOD
    )["VersionId"]
    event = upload_event(pipeline.data_bucket, "training-data/w.jsonl", version)
    start = pipeline.function(STEP["start_run"].handler)
    first = pipeline.dispatcher.call(start, event)
    finished(clients["stepfunctions"], first["execution_arn"])
    second = pipeline.dispatcher.call(start, event)
    assert second == {**first, "already_finished": True}
    assert (
        len(
            clients["stepfunctions"].list_executions(stateMachineArn=pipeline.state_machine_arn)[
                "executions"
            ]
        )
        == 1
    )


def test_an_invalid_dataset_fails_at_validation_and_creates_nothing(local) -> None:
    pipeline, clients = local
    started = _upload(pipeline, clients, "training-data/bad.jsonl", GOOD + b"{broken\n")
    described = finished(clients["stepfunctions"], started["execution_arn"])
    assert described["status"] == "FAILED" and described["error"] == "DatasetInvalid"
    assert "line 4: not valid JSON" in described["cause"]
    assert pipeline.dispatcher.invocations == [
        "start_run",
        "validate",
        "release_compute",
        "teardown",
        "notify_end",
    ]
    assert (
        _run_queues(clients) == []
        and clients["dynamodb"].scan(TableName=pipeline.environment["RUNS_TABLE"])["Count"] == 0
    )
    (notice,) = _notifications(clients)
    assert (
        "FAILED\nfailed in Validate: DatasetInvalid: s3://" in notice
        and "line 4: not valid JSON" in notice
    )


class Injected(RuntimeError):
    """A fault injected into one step."""


@pytest.mark.parametrize(
    ("step", "state"),
    [
        ("validate", "Validate"),
        ("register", "Register"),
        ("provision", "Provision"),
        ("scale_up", "ScaleUp"),
        ("nodes_ready", "NodesReady"),
        ("start_workers", "StartWorkers"),
        ("workers_healthy", "WorkersHealthy"),
        ("start_evaluation", "EvaluateBaseline"),
        ("submit_job", "SubmitJob"),
        ("monitor", "Monitor"),
        ("collect", "Collect"),
        ("notify_end", "NotifySuccess"),
    ],
)
def test_a_fault_in_any_state_fails_the_run_with_its_error_and_tears_down(
    local, step: str, state: str
) -> None:
    pipeline, clients = local
    calls = {"n": 0}

    def fault(handler: str, event: dict) -> None:
        if handler == step and event.get("succeeded") is not False:
            calls["n"] += 1
            if calls["n"] == 1:
                raise Injected(f"injected into {step}")

    pipeline.dispatcher.fault = fault
    started = _upload(pipeline, clients, "training-data/w.jsonl", GOOD)
    described = finished(clients["stepfunctions"], started["execution_arn"])
    assert described["status"] == "FAILED", described
    assert described["error"] == "Injected" and f"injected into {step}" in described["cause"]
    assert _run_queues(clients) == []
    assert pipeline.dispatcher.invocations[-3:] == ["release_compute", "teardown", "notify_end"]
    notices = _notifications(clients)
    assert any(f"FAILED\nfailed in {state}: " in notice for notice in notices), notices


def test_a_transient_teardown_fault_is_retried(local) -> None:
    pipeline, clients = local
    failed_once = []

    def fault(handler: str, event: dict) -> None:
        if handler == "teardown" and not failed_once:
            failed_once.append(True)
            raise Injected("teardown hiccup")

    pipeline.dispatcher.fault = fault
    started = _upload(pipeline, clients, "training-data/w.jsonl", GOOD)
    described = finished(clients["stepfunctions"], started["execution_arn"])
    assert described["status"] == "SUCCEEDED", described
    assert pipeline.dispatcher.invocations.count("teardown") == 2 and _run_queues(clients) == []


def test_a_failed_training_job_fails_the_run_and_releases_compute(local, compute) -> None:
    pipeline, clients = local
    fleet, cluster = compute
    cluster.phases[:] = [
        JobStatus("running", step=1),
        JobStatus("failed", reason="ImagePullBackOff: trainer image not found"),
    ]
    started = _upload(pipeline, clients, "training-data/w.jsonl", GOOD)
    described = finished(clients["stepfunctions"], started["execution_arn"])
    assert described["status"] == "FAILED" and described["error"] == "TrainingJobFailed"
    assert described["cause"] == "failed: ImagePullBackOff: trainer image not found"
    assert cluster.calls[-2:] == ["delete", "scale_down"] and fleet.calls == ["start", "stop"]
    assert _run_queues(clients) == []
    (notice,) = _notifications(clients)
    assert "failed in TrainingJob: failed: ImagePullBackOff" in notice
