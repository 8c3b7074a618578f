"""The steps about a run's bookkeeping: start it, validate its dataset, register it, create and
delete its router resources, say how it ended. Errors are raised as exceptions whose class names
the Step Functions states catch (`DatasetInvalid`, `BudgetExceeded`, `TrainingConfigError`);
their messages are what the failure notification shows."""

from __future__ import annotations

import json
import logging
from typing import Any

from aws_lambda_powertools.utilities.parser.models import S3EventNotificationEventBridgeModel
from botocore.exceptions import ClientError
from pydantic import BaseModel, ConfigDict, model_validator

from domain.backends import METRICS_OBJECT, recent_metrics
from domain.bucket import EVALUATION_OBJECT, SUMMARY_OBJECT, object_exists, run_output_prefix
from domain.dataset import counted
from domain.nova_job import is_nova, recipe_skips
from domain.run_state import (
    ProvisionRequest,
    RegisteredRun,
    RunEnd,
    RunNotice,
    RunRef,
    RunResources,
    StartedRun,
    TornDown,
    Validation,
)
from domain.runs import FINISHED, RunRecord, RunStore, run_id_for
from domain.tracking import TrackedRun, tracked_run
from lambdas.pipeline.dependencies import Dependencies
from lambdas.pipeline.experiment_tracking import MlflowServer, TrackingFailed
from lambdas.pipeline.notify import notify, summary
from lambdas.pipeline.register import register_run
from lambdas.pipeline.resources import provision_run, teardown_run
from lambdas.pipeline.validate import validate_upload

log = logging.getLogger("mtrl.pipeline")
HELD_OUT_CAUTION = "held_out"  # the run's health warning of the held-out check


class DatasetInvalid(ValueError):
    """The uploaded dataset has problems; nothing was created."""


class Upload(BaseModel):
    """The dataset a run is about: from the upload rule's EventBridge `Object Created` event
    (read as Powertools models S3's), from the state machine's `{"upload": ...}`, or as is."""

    model_config = ConfigDict(frozen=True)

    bucket: str
    key: str
    version_id: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _unwrapped(cls, event: Any) -> Any:
        if isinstance(event, dict) and "detail" in event:
            detail = S3EventNotificationEventBridgeModel.model_validate(event).detail
            return {
                "bucket": detail.bucket.name, "key": detail.object.key,
                "version_id": detail.object.version_id,
            }  # fmt: skip
        if isinstance(event, dict) and "upload" in event:
            return event["upload"]
        return event

    @property
    def run_id(self) -> str:
        return run_id_for(self.bucket, self.key, self.version_id)


class RunSteps:
    def __init__(self, dependencies: Dependencies) -> None:
        self.settings = dependencies.settings
        self._clients, self._clock = dependencies.clients, dependencies.clock

    def _runs(self) -> RunStore:
        return RunStore(self._clients("dynamodb"), self.settings.runs_table)

    def start_run(self, upload: Upload) -> StartedRun:
        """EventBridge target: start the state machine with the run id as execution name. Step
        Functions makes that idempotent: a duplicate event while the run goes on returns the
        same execution; after it ended, the name is taken and nothing new starts."""
        sfn = self._clients("stepfunctions")
        try:
            answer = sfn.start_execution(
                stateMachineArn=self.settings.state_machine_arn,
                name=upload.run_id,
                input=upload.model_dump_json(),
            )
            return StartedRun(
                run_id=upload.run_id, execution_arn=answer["executionArn"], already_finished=False
            )
        except sfn.exceptions.ExecutionAlreadyExists:
            execution = self.settings.execution_arn(upload.run_id)
            return StartedRun(run_id=upload.run_id, execution_arn=execution, already_finished=True)

    def validate(self, upload: Upload) -> Validation:
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
        return Validation(
            run_id=upload.run_id, records=outcome.records, report_key=outcome.report_key
        )

    def register(self, upload: Upload) -> RegisteredRun:
        settings = self.settings
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
            serverless_plane=settings.serverless_job_role_arn is not None,
        )
        return RegisteredRun(
            run_id=registered.run.run_id,
            poll_seconds=settings.poll_seconds,
            created=registered.created,
            config=registered.config,
            cost_per_hour=registered.cost.per_hour,
            deadline_at=registered.run.deadline_at,
            base=registered.base,
        )

    def provision(self, request: ProvisionRequest) -> RunResources:
        """A Nova run's jobs invoke the rollout Lambda, so it holds it until it is torn down (or
        its deadline has long passed)."""
        run = request.run
        provisioned = provision_run(
            self.settings.router_wiring(self._clients),
            run_id=run.run_id,
            kms_key_id=self.settings.data_key_arn,
            alert_topic_arn=self.settings.alert_topic_arn,
            nova_deadline=run.deadline_at if is_nova(run.config.model) else None,
            now=self._clock(),
        )
        return RunResources(
            run_id=run.run_id,
            queues=provisioned.queues,
            alarms=provisioned.alarms,
            rollout_request_arn=provisioned.rollout_request_arn,
        )

    def teardown(self, run: RunRef) -> TornDown:
        return teardown_run(self.settings.router_wiring(self._clients), run_id=run.run_id)

    def notify_end(self, end: RunEnd) -> RunNotice:
        """The run's end as its notification says it (the summary's document, and the SNS
        message's id)."""
        # The run is unknown when the pipeline failed before registering it (invalid dataset).
        runs, now = self._runs(), self._clock()
        error = _readable(end.error)
        run = runs.get(end.run_id)
        if run is not None and run.status not in FINISHED:
            status = "succeeded" if end.succeeded else "failed"
            # The held-out check joins the run's health warnings (`mtrl status`, the notice).
            caution = {HELD_OUT_CAUTION: end.caution} if end.caution else {}
            run = runs.update(
                run.run_id, now=now, status=status, error=error, evaluation=end.evaluation,
                health={**run.health, **caution}, notes=self._notes(run),
            )  # fmt: skip
        notice = summary(
            run,
            run_id=end.run_id,
            succeeded=end.succeeded,
            now=now,
            failed_state=end.failed_state,
            error=error,
            teardown=end.teardown,
            evaluation=end.evaluation,
        )
        if run is not None and run.config is not None and self.settings.mlflow_tracking_server_arn:
            tracking = self._track(run, succeeded=end.succeeded, error=error)
            notice = notice.model_copy(update={"tracking": tracking})
        topic = self.settings.alert_topic_arn
        if topic:
            notice = notice.model_copy(
                update={"message_id": notify(self._clients("sns"), topic, notice)}
            )
        return notice

    def _notes(self, run: RunRecord) -> list[str]:
        """What the run did without: each recipe's skipped overrides, each skipped evaluation
        and why (its outputs say; a note that cannot be read is said, never raised)."""
        s3, prefix = self._clients("s3"), run_output_prefix(run.run_id)
        try:
            notes = recipe_skips(s3, bucket=run.bucket, output_prefix=prefix)
            key = f"{prefix}{EVALUATION_OBJECT}"
            if object_exists(s3, bucket=run.bucket, key=key):
                report = json.loads(s3.get_object(Bucket=run.bucket, Key=key)["Body"].read())
                skipped = report.get("skipped", {})
                notes += [f"{stage} evaluation skipped: {why}" for stage, why in skipped.items()]
        except ClientError as error:
            return [f"notes not read: {error.response.get('Error', {}).get('Code', error)}"]
        return notes

    def _track(self, run: RunRecord, *, succeeded: bool, error: str | None) -> str:
        """The run as an MLflow run of the deployment's tracking server: its config, each step's
        metrics, its evaluation, health and outcome, and its summary files. A tracking failure
        is said, never raised: the run's outcome stands (NotifyEnd failing would fail a run
        that succeeded)."""
        try:
            server = MlflowServer(
                self.settings.mlflow_tracking_server_arn or "",
                credentials=self._clients.credentials,
                s3=self._clients("s3"),
                endpoint=self.settings.mlflow_endpoint,
            )
            return f"MLflow run {server.log(self._tracked(run, succeeded, error))} ({server.arn})"
        except Exception as failed:  # noqa: BLE001 - see above
            log.exception("run %s not tracked", run.run_id)
            reason = failed if isinstance(failed, TrackingFailed) else repr(failed)
            return f"not tracked: {reason}"

    def _tracked(self, run: RunRecord, succeeded: bool, error: str | None) -> TrackedRun:
        s3, prefix = self._clients("s3"), run_output_prefix(run.run_id)
        files = {
            name: s3.get_object(Bucket=run.bucket, Key=f"{prefix}{name}")["Body"].read()
            for name in (SUMMARY_OBJECT, EVALUATION_OBJECT)
            if object_exists(s3, bucket=run.bucket, key=f"{prefix}{name}")
        }
        evaluation = json.loads(files[EVALUATION_OBJECT]) if EVALUATION_OBJECT in files else None
        return tracked_run(
            run_id=run.run_id,
            succeeded=succeeded,
            config=run.config,  # type: ignore[arg-type] - checked by the caller
            dataset=f"s3://{run.bucket}/{run.key}",
            metrics=recent_metrics(s3, bucket=run.bucket, key=f"{prefix}{METRICS_OBJECT}"),
            evaluation=evaluation,
            health=run.health,
            reason=error,
            artifacts=files,
        )


def _readable(cause: str | None) -> str | None:
    """A Lambda error's cause (`{"errorType", "errorMessage", ...}`) as `Type: message`."""
    try:
        parsed = json.loads(cause) if cause else None
    except json.JSONDecodeError:
        return cause
    if isinstance(parsed, dict) and "errorMessage" in parsed:
        return f"{parsed.get('errorType', 'Error')}: {parsed['errorMessage']}"
    return cause
