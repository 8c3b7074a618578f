"""What `mtrl runs` and `mtrl status` show: the runs table, and for one run what each plane says.

A run's status gathers, each from its source of truth: the execution (state machine status and
the state it is in), the run's last metrics (step, reward, pass rate), the checkpoints its
summary records (once the run ended), the run queues (depth, in flight),
the reward fleet (running / wanted workers), the GPU instance group (running nodes), and the
clock against the run's cost per hour and deadline. A plane that cannot be read (not created yet,
already torn down) shows as absent rather than failing the whole view.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from typing import Any

from botocore.exceptions import ClientError

from domain.backends import METRICS_OBJECT, recent_metrics
from domain.bucket import SUMMARY_OBJECT, object_exists, run_output_prefix
from domain.health import measured
from domain.naming import StackOutput, worker_service_name
from domain.nova_job import recipe_skips
from domain.run_queues import QueueKind, queue_name
from domain.runs import FINISHED, RunRecord, RunStore
from domain.step_metrics import number
from mtrl.ops.deployment import Deployment


class UnknownRun(LookupError):
    """No such run in the deployment's runs table."""


@dataclass(frozen=True)
class RunSummary:
    run_id: str
    status: str
    config: str
    created_at: float
    elapsed_hours: float
    cost_per_hour: float
    spent_usd: float
    deadline_in_hours: float | None  # None once finished
    error: str | None
    evaluation: str | None  # the held-out evaluation's headline, once the run succeeded
    health: tuple[str, ...]  # run-health warnings that hold, as Monitor keeps them


@dataclass(frozen=True)
class QueueDepth:
    kind: str
    waiting: int
    in_flight: int
    oldest_seconds: float | None = None  # CloudWatch's age of the oldest message, last 5 minutes


@dataclass(frozen=True)
class RunDetails:
    """What `mtrl status` shows of one run: its summary, execution, training progress, queues,
    workers and GPU nodes."""

    summary: RunSummary
    execution: str | None  # RUNNING, SUCCEEDED, ... (None: never started)
    state: str | None  # the state the execution is in, or ended in
    step: int | None
    mean_reward: float | None
    pass_rate: float | None  # of the step's rollouts that said whether they succeeded
    health_figures: dict[str, float]  # the last step's run-health metrics (domain/health.py)
    update: dict[str, float]  # the last step's update figures its trainer wrote (UPDATE_FIGURES)
    checkpoints: list[dict[str, Any]]  # each job's manifest and where it points (summary.json)
    queues: list[QueueDepth]
    workers: tuple[int, int] | None  # (running, wanted)
    gpu_nodes: int | None
    notes: list[str]  # what it did without (the record's once it ended; its recipes' till then)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# What `mtrl status` shows of a step's update, where its trainer wrote them (the open-weights
# trainer writes them all; the local policy the first two).
UPDATE_FIGURES = ("objective", "clipped_fraction", "grad_norm", "entropy", "masked_fraction",
                  "mismatch_kl", "learning_rate")  # fmt: skip


def update_figures(line: dict[str, Any]) -> dict[str, float]:
    return {
        name: float(line[name]) for name in UPDATE_FIGURES if number(line.get(name)) is not None
    }


def summarize(run: RunRecord, *, now: float) -> RunSummary:
    finished = run.status in FINISHED
    return RunSummary(
        run_id=run.run_id,
        status=run.status,
        config=run.config_name,
        created_at=run.created_at,
        elapsed_hours=run.hours(now),
        cost_per_hour=run.cost_per_hour,
        spent_usd=run.spent_usd(now),
        deadline_in_hours=None if finished else (run.deadline_at - now) / 3600,
        error=run.error,
        evaluation=run.evaluation,
        health=tuple(sorted(run.health.values())),
    )


def list_runs(dynamodb: Any, deployment: Deployment, *, now: float) -> list[RunSummary]:
    """Every run of the deployment, newest first."""
    return [summarize(run, now=now) for run in RunStore(dynamodb, deployment.runs_table).all()]


def run_status(
    clients: dict[str, Any], deployment: Deployment, run_id: str, *, now: float
) -> RunDetails:
    """`clients`: boto3 clients by service name (dynamodb, stepfunctions, s3, sqs, cloudwatch, ecs,
    sagemaker)."""
    run = RunStore(clients["dynamodb"], deployment.runs_table).get(run_id)
    if run is None:
        raise UnknownRun(
            f"no run {run_id} in deployment {deployment.prefix} ({deployment.region}): "
            "`mtrl runs` lists them"
        )
    execution, state = _execution(clients["stepfunctions"], deployment.execution_arn(run_id))
    prefix = run_output_prefix(run_id)
    lines = recent_metrics(clients["s3"], bucket=run.bucket, key=f"{prefix}{METRICS_OBJECT}")
    metrics = lines[-1] if lines else None
    return RunDetails(
        summary=summarize(run, now=now),
        execution=execution,
        state=state,
        step=metrics["step"] if metrics else None,
        mean_reward=metrics.get("mean_reward") if metrics else None,
        pass_rate=metrics.get("pass_rate") if metrics else None,
        health_figures=measured(lines) if lines else {},
        update=update_figures(metrics or {}),
        checkpoints=run_summary(clients["s3"], run).get("checkpoints", []),
        queues=_queues(clients["sqs"], clients["cloudwatch"], deployment.prefix, run_id, now=now),
        workers=_workers(clients["ecs"], deployment, run_id),
        gpu_nodes=_gpu_nodes(clients["sagemaker"], deployment),
        notes=(
            run.notes
            if run.status in FINISHED
            else recipe_skips(clients["s3"], bucket=run.bucket, output_prefix=prefix)
        ),
    )


def run_summary(s3: Any, run: RunRecord) -> dict[str, Any]:
    """The summary Collect wrote for the run (empty before the run ended)."""
    key = f"{run_output_prefix(run.run_id)}{SUMMARY_OBJECT}"
    if not object_exists(s3, bucket=run.bucket, key=key):
        return {}
    return json.loads(s3.get_object(Bucket=run.bucket, Key=key)["Body"].read())


def billed_tokens(s3: Any, run: RunRecord) -> dict[str, int] | None:
    """The tokens SageMaker billed a serverless run's managed job, as it reported them
    (TrainTokenCount, PrefillTokenCount, SampleTokenCount); None for another run, or before
    the run ended."""
    return run_summary(s3, run).get("billable_token_usage")


def _execution(sfn: Any, arn: str) -> tuple[str | None, str | None]:
    try:
        status = sfn.describe_execution(executionArn=arn)["status"]
    except sfn.exceptions.ExecutionDoesNotExist:
        return None, None
    events = sfn.get_execution_history(executionArn=arn, reverseOrder=True, maxResults=50)
    entered = [event for event in events["events"] if "stateEnteredEventDetails" in event]
    if not entered:
        return status, None
    latest = max(entered, key=lambda event: event["id"])  # whatever order the page came in
    return status, latest["stateEnteredEventDetails"]["name"]


def _queues(sqs: Any, cloudwatch: Any, prefix: str, run_id: str, *, now: float) -> list[QueueDepth]:
    depths, names = [], []
    for kind in QueueKind:
        name = queue_name(prefix, run_id, kind)
        try:
            url = sqs.get_queue_url(QueueName=name)["QueueUrl"]
            attributes = sqs.get_queue_attributes(
                QueueUrl=url,
                AttributeNames=[
                    "ApproximateNumberOfMessages",
                    "ApproximateNumberOfMessagesNotVisible",
                ],
            )["Attributes"]
        except ClientError:
            continue  # not created yet, or torn down
        names.append(name)
        depths.append(
            QueueDepth(
                kind.suffix,
                int(attributes["ApproximateNumberOfMessages"]),
                int(attributes["ApproximateNumberOfMessagesNotVisible"]),
            )
        )
    ages = _oldest_ages(cloudwatch, names, now=now)
    return [replace(q, oldest_seconds=age) for q, age in zip(depths, ages, strict=True)]


def _oldest_ages(cloudwatch: Any, names: list[str], *, now: float) -> list[float | None]:
    """The age of each queue's oldest message (SQS publishes it every minute), in one call."""
    if not names:
        return []
    queries = [
        {
            "Id": f"q{index}",
            "MetricStat": {
                "Metric": {
                    "Namespace": "AWS/SQS",
                    "MetricName": "ApproximateAgeOfOldestMessage",
                    "Dimensions": [{"Name": "QueueName", "Value": name}],
                },
                "Period": 60,
                "Stat": "Maximum",
            },
        }
        for index, name in enumerate(names)
    ]
    try:
        results = cloudwatch.get_metric_data(
            MetricDataQueries=queries,
            StartTime=datetime.fromtimestamp(now - 300, UTC),
            EndTime=datetime.fromtimestamp(now, UTC),
            ScanBy="TimestampDescending",
        )["MetricDataResults"]
    except ClientError:
        return [None] * len(names)
    latest = {r["Id"]: r["Values"][0] for r in results if r.get("Values")}
    return [latest.get(f"q{index}") for index in range(len(names))]


def _workers(ecs: Any, deployment: Deployment, run_id: str) -> tuple[int, int] | None:
    cluster = deployment.outputs.get(StackOutput.REWARD_WORKER_CLUSTER_NAME)
    if not cluster:
        return None
    service = worker_service_name(deployment.prefix, run_id)
    try:
        found = ecs.describe_services(cluster=cluster, services=[service])["services"]
    except ClientError:
        return None
    active = [s for s in found if s["status"] == "ACTIVE"]
    return (active[0]["runningCount"], active[0]["desiredCount"]) if active else None


def _gpu_nodes(sagemaker: Any, deployment: Deployment) -> int | None:
    """The training group's running nodes (not the system group's): what runs pay for."""
    cluster = deployment.outputs.get(StackOutput.HYPER_POD_CLUSTER_NAME)
    group = deployment.outputs.get(StackOutput.HYPER_POD_TRAINING_GROUP_NAME)
    if not cluster or not group:
        return None
    try:
        pages = sagemaker.get_paginator("list_cluster_nodes").paginate(
            ClusterName=cluster, InstanceGroupNameContains=group
        )
        return sum(
            1
            for page in pages
            for node in page["ClusterNodeSummaries"]
            if node["InstanceGroupName"] == group and node["InstanceStatus"]["Status"] == "Running"
        )
    except ClientError:
        return None
