"""The steps about a run's bookkeeping: start it, validate its dataset, register it, create and
delete its router resources, say how it ended. Errors are raised as exceptions whose class names
the Step Functions states catch (`DatasetInvalid`, `BudgetExceeded`, `TrainingConfigError`);
their messages are what the failure notification shows."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict

from domain.dataset import counted
from domain.run_state import RegisteredRun, RunResources
from domain.runs import FINISHED, RunStore, run_id_for
from lambdas.pipeline.dependencies import Dependencies
from lambdas.pipeline.notify import notify, summary
from lambdas.pipeline.register import register_run
from lambdas.pipeline.resources import provision_run, teardown_run
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


class RunSteps:
    def __init__(self, dependencies: Dependencies) -> None:
        self.settings = dependencies.settings
        self._clients, self._clock = dependencies.clients, dependencies.clock

    def _runs(self) -> RunStore:
        return RunStore(self._clients("dynamodb"), self.settings.runs_table)

    def start_run(self, event: dict[str, Any]) -> dict[str, Any]:
        """EventBridge target: start the state machine with the run id as execution name. Step
        Functions makes that idempotent: a duplicate event while the run goes on returns the
        same execution; after it ended, the name is taken and nothing new starts."""
        sfn = self._clients("stepfunctions")
        upload = Upload.from_event(event)
        try:
            answer = sfn.start_execution(
                stateMachineArn=self.settings.state_machine_arn,
                name=upload.run_id,
                input=upload.model_dump_json(),
            )
            return {
                "run_id": upload.run_id,
                "execution_arn": answer["executionArn"],
                "already_finished": False,
            }
        except sfn.exceptions.ExecutionAlreadyExists:
            execution = self.settings.execution_arn(upload.run_id)
            return {"run_id": upload.run_id, "execution_arn": execution, "already_finished": True}

    def validate(self, event: dict[str, Any]) -> dict[str, Any]:
        upload = Upload.from_event(event)
        outcome = validate_upload(
            self._clients("s3"),
            bucket=upload.bucket,
            key=upload.key,
            version_id=upload.version_id,
            run_id=upload.run_id,
        )
        if not outcome.valid:
            shown = "; ".join(outcome.first_problems[:5])
            raise DatasetInvalid(
                f"s3://{upload.bucket}/{upload.key}: {counted(outcome.problems, 'problem')} "
                f"({shown}); full "
                f"report s3://{upload.bucket}/{outcome.report_key}"
            )
        return {
            "run_id": upload.run_id,
            "records": outcome.records,
            "report_key": outcome.report_key,
        }

    def register(self, event: dict[str, Any]) -> dict[str, Any]:
        settings, upload = self.settings, Upload.from_event(event)
        registered = register_run(
            self._clients("s3"),
            self._runs(),
            bucket=upload.bucket,
            key=upload.key,
            version_id=upload.version_id,
            default_config=settings.default_config,
            now=self._clock(),
            presets=settings.model_presets,
            instance_type=settings.training_instance_type,
            nova_instance_type=settings.nova_instance_type,
        )
        return RegisteredRun(
            run_id=registered.run.run_id,
            poll_seconds=settings.poll_seconds,
            created=registered.created,
            config=registered.config,
            cost_per_hour=registered.cost.per_hour,
            deadline_at=registered.run.deadline_at,
            base=registered.base,
        ).model_dump(mode="json")

    def provision(self, event: dict[str, Any]) -> dict[str, Any]:
        provisioned = provision_run(
            self.settings.router_wiring(self._clients),
            run_id=event["run_id"],
            kms_key_id=self.settings.data_key_arn,
            alert_topic_arn=self.settings.alert_topic_arn,
        )
        resources = RunResources(
            run_id=event["run_id"],
            queues=provisioned.queues,
            alarms=provisioned.alarms,
            rollout_request_arn=provisioned.rollout_request_arn,
        )
        return resources.model_dump(mode="json")

    def teardown(self, event: dict[str, Any]) -> dict[str, Any]:
        result = teardown_run(self.settings.router_wiring(self._clients), run_id=event["run_id"])
        return {"run_id": event["run_id"], **result}

    def notify_end(self, event: dict[str, Any]) -> dict[str, Any]:
        """`event`: {"run_id", "succeeded", "failed_state"?, "error"?, "teardown"?,
        "evaluation"? (its headline)}."""
        # The run is unknown when the pipeline failed before registering it (invalid dataset).
        runs, now = self._runs(), self._clock()
        error = _readable(event.get("error"))
        run = runs.get(event["run_id"])
        if run is not None and run.status not in FINISHED:
            status = "succeeded" if event.get("succeeded") else "failed"
            run = runs.update(
                run.run_id, now=now, status=status, error=error, evaluation=event.get("evaluation")
            )
        report = summary(
            run,
            run_id=event["run_id"],
            succeeded=bool(event.get("succeeded")),
            now=now,
            failed_state=event.get("failed_state"),
            error=error,
            teardown=event.get("teardown"),
            evaluation=event.get("evaluation"),
        )
        topic = self.settings.alert_topic_arn
        message_id = notify(self._clients("sns"), topic, report) if topic else None
        return {**report, "message_id": message_id}


def _readable(cause: str | None) -> str | None:
    """A Lambda error's cause (`{"errorType", "errorMessage", ...}`) as `Type: message`."""
    try:
        parsed = json.loads(cause) if cause else None
    except json.JSONDecodeError:
        return cause
    if isinstance(parsed, dict) and "errorMessage" in parsed:
        return f"{parsed.get('errorType', 'Error')}: {parsed['errorMessage']}"
    return cause
