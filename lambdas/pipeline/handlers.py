"""Thin Lambda handlers of the pipeline: parse a typed event, call a step, return a typed result.

Errors are raised as exceptions whose class names the Step Functions states catch
(`DatasetInvalid`, `BudgetExceeded`, `TrainingConfigError`); their messages are what the
failure notification shows.
"""

from __future__ import annotations

import functools
import json
import time
from typing import Any

import boto3
from pydantic import BaseModel, ConfigDict

from domain import backends
from domain.runs import FINISHED, RunStore, run_id_for
from lambdas.pipeline import compute, policies
from lambdas.pipeline.notify import notify, summary
from lambdas.pipeline.register import register_run
from lambdas.pipeline.resources import RouterWiring, provision_run, teardown_run
from lambdas.pipeline.settings import PipelineSettings
from lambdas.pipeline.validate import validate_upload


class DatasetInvalid(ValueError):
    """The uploaded dataset has problems; nothing was created."""


class Upload(BaseModel):
    """The dataset a run is about: from an EventBridge `Object Created` event, or state input."""

    model_config = ConfigDict(frozen=True)

    bucket: str
    key: str
    version_id: str | None = None

    @classmethod
    def from_event(cls, event: dict[str, Any]) -> Upload:
        if (
            "detail" in event
        ):  # EventBridge: {"detail": {"bucket": {"name"}, "object": {"key", "version-id"}}}
            detail = event["detail"]
            return cls(
                bucket=detail["bucket"]["name"],
                key=detail["object"]["key"],
                version_id=detail["object"].get("version-id"),
            )
        return cls.model_validate(event.get("upload", event))

    @property
    def run_id(self) -> str:
        return run_id_for(self.bucket, self.key, self.version_id)


def _settings() -> PipelineSettings:
    return PipelineSettings.from_env()


def start_run(
    event: dict[str, Any],
    context: Any = None,
    *,
    sfn: Any = None,
    settings: PipelineSettings | None = None,
) -> dict[str, Any]:
    """EventBridge target: start the state machine with the run id as execution name. Step
    Functions makes that idempotent: a duplicate event while the run goes on returns the same
    execution; after it ended, the name is taken and nothing new starts."""
    settings = settings or _settings()
    sfn = sfn or boto3.client("stepfunctions")
    upload = Upload.from_event(event)
    try:
        answer = sfn.start_execution(
            stateMachineArn=settings.state_machine_arn,
            name=upload.run_id,
            input=upload.model_dump_json(),
        )
        return {
            "run_id": upload.run_id,
            "execution_arn": answer["executionArn"],
            "already_finished": False,
        }
    except sfn.exceptions.ExecutionAlreadyExists:
        execution = settings.execution_arn(upload.run_id)
        return {"run_id": upload.run_id, "execution_arn": execution, "already_finished": True}


def validate(event: dict[str, Any], context: Any = None, *, s3: Any = None) -> dict[str, Any]:
    upload = Upload.from_event(event)
    outcome = validate_upload(
        s3 or boto3.client("s3"),
        bucket=upload.bucket,
        key=upload.key,
        version_id=upload.version_id,
        run_id=upload.run_id,
    )
    if not outcome.valid:
        shown = "; ".join(outcome.first_problems[:5])
        raise DatasetInvalid(
            f"s3://{upload.bucket}/{upload.key}: {outcome.problems} problems ({shown}); full report "
            f"s3://{upload.bucket}/{outcome.report_key}"
        )
    return {"run_id": upload.run_id, "records": outcome.records, "report_key": outcome.report_key}


def register(
    event: dict[str, Any],
    context: Any = None,
    *,
    s3: Any = None,
    dynamodb: Any = None,
    settings: PipelineSettings | None = None,
    now: float | None = None,
) -> dict[str, Any]:
    settings = settings or _settings()
    upload = Upload.from_event(event)
    registered = register_run(
        s3 or boto3.client("s3"),
        RunStore(dynamodb or boto3.client("dynamodb"), settings.runs_table),
        bucket=upload.bucket,
        key=upload.key,
        version_id=upload.version_id,
        default_config=settings.default_config,
        now=time.time() if now is None else now,
        presets=settings.model_presets,
        instance_type=settings.training_instance_type,
    )
    return {
        "run_id": registered.run.run_id,
        "poll_seconds": settings.poll_seconds,
        "created": registered.created,
        "config": registered.config.model_dump(mode="json"),
        "cost_per_hour": registered.cost.per_hour,
        "deadline_at": registered.run.deadline_at,
    }


def provision(
    event: dict[str, Any],
    context: Any = None,
    *,
    wiring: RouterWiring | None = None,
    settings: PipelineSettings | None = None,
) -> dict[str, Any]:
    settings = settings or _settings()
    provisioned = provision_run(
        wiring or settings.router_wiring(),
        run_id=event["run_id"],
        kms_key_id=settings.data_key_arn,
        alert_topic_arn=settings.alert_topic_arn,
    )
    return {"run_id": event["run_id"], "queues": provisioned.queues, "alarms": provisioned.alarms}


def teardown(
    event: dict[str, Any],
    context: Any = None,
    *,
    wiring: RouterWiring | None = None,
    settings: PipelineSettings | None = None,
) -> dict[str, Any]:
    settings = settings or _settings()
    result = teardown_run(wiring or settings.router_wiring(), run_id=event["run_id"])
    return {"run_id": event["run_id"], **result}


def notify_end(
    event: dict[str, Any],
    context: Any = None,
    *,
    sns: Any = None,
    dynamodb: Any = None,
    settings: PipelineSettings | None = None,
    now: float | None = None,
) -> dict[str, Any]:
    """`event`: {"run_id", "succeeded", "failed_state"?, "error"?, "teardown"?}."""
    settings = settings or _settings()
    # The run is unknown when the pipeline failed before registering it (invalid dataset).
    runs = RunStore(dynamodb or boto3.client("dynamodb"), settings.runs_table)
    now = time.time() if now is None else now
    error = _readable(event.get("error"))
    run = runs.get(event["run_id"])
    if run is not None and run.status not in FINISHED:
        status = "succeeded" if event.get("succeeded") else "failed"
        run = runs.update(run.run_id, now=now, status=status, error=error)
    report = summary(
        run,
        run_id=event["run_id"],
        succeeded=bool(event.get("succeeded")),
        now=now,
        failed_state=event.get("failed_state"),
        error=error,
        teardown=event.get("teardown"),
    )
    message_id = (
        notify(sns or boto3.client("sns"), settings.alert_topic_arn, report)
        if settings.alert_topic_arn
        else None
    )
    return {**report, "message_id": message_id}


class ReapRequest(BaseModel):
    """What the reaper is asked: nothing (its schedule: every overdue or orphaned run), one run
    to tear down now (`mtrl teardown RUN`), or idle GPU nodes to release (`--all-idle`)."""

    model_config = ConfigDict(extra="ignore")  # a scheduled event carries EventBridge's fields

    run_id: str | None = None
    release_idle: bool = False


def reap(
    event: dict[str, Any],
    context: Any = None,
    *,
    sfn: Any = None,
    wiring: RouterWiring | None = None,
    dynamodb: Any = None,
    settings: PipelineSettings | None = None,
    now: float | None = None,
) -> dict[str, Any]:
    """Tear down every run past its deadline, or whose execution is no longer running (stopped
    by hand, or lost) — so nothing keeps burning money unnoticed; or the one run asked for,
    whatever its state. Compute first, as the state machine does; a run whose compute cannot be
    released yet stays unfinished and is tried again on the next schedule."""
    request = ReapRequest.model_validate(event or {})
    settings = settings or _settings()
    if request.release_idle:
        cluster = backends.training_cluster(settings.training_cluster_backend)
        return {"reaped": [], "retry": [], "released_idle": cluster.release_idle(immediately=True)}
    sfn = sfn or boto3.client("stepfunctions")
    runs = RunStore(dynamodb or boto3.client("dynamodb"), settings.runs_table)
    now = time.time() if now is None else now
    if request.run_id is None:
        candidates = runs.unfinished()
    else:
        asked = runs.get(request.run_id)
        if asked is None:
            return {"reaped": [], "retry": [], "unknown": request.run_id}
        candidates = [asked]
    # Made once, when a run needs them (a backend that cannot be made is that run's retry).
    fleet = functools.cache(lambda: backends.reward_fleet(settings.reward_fleet_backend))
    cluster = functools.cache(lambda: backends.training_cluster(settings.training_cluster_backend))
    wiring = wiring or settings.router_wiring()
    asked_for = request.run_id is not None
    reaped, retry = [], []
    for run in candidates:
        execution = settings.execution_arn(run.run_id)
        try:
            status = sfn.describe_execution(executionArn=execution)["status"]
        except sfn.exceptions.ExecutionDoesNotExist:
            status = "MISSING"
        decided = policies.reaping(
            execution_status=status, deadline_at=run.deadline_at, now=now, asked_for=asked_for
        )
        if decided is None:
            continue
        reason = decided.reason
        if decided.stop_execution:
            sfn.stop_execution(
                executionArn=execution, error=decided.error, cause=f"run {run.run_id}: {reason}"
            )
        try:
            released = compute.release(
                compute.teardown_context(
                    run.run_id, bucket=run.bucket, key=run.key, version_id=run.version_id
                ),
                fleet=fleet(),
                cluster=cluster(),
                scale_down=True,
            )
        except Exception as failure:  # noqa: BLE001 - one run's trouble must not stop the others
            retry.append({"run_id": run.run_id, "error": f"{type(failure).__name__}: {failure}"})
            continue
        result = teardown_run(wiring, run_id=run.run_id)
        if run.status not in FINISHED:
            runs.update(run.run_id, now=now, status="failed", error=f"reaped: {reason}")
        reaped.append({"run_id": run.run_id, "reason": reason, **released, **result})
    return {"reaped": reaped, "retry": retry}


def _readable(cause: str | None) -> str | None:
    """A Lambda error's cause (`{"errorType", "errorMessage", ...}`) as `Type: message`."""
    try:
        parsed = json.loads(cause) if cause else None
    except json.JSONDecodeError:
        return cause
    if isinstance(parsed, dict) and "errorMessage" in parsed:
        return f"{parsed.get('errorType', 'Error')}: {parsed['errorMessage']}"
    return cause
