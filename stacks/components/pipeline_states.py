"""The pipeline's state machine: its definition (which function each state runs, the polls, the
failure path) and the machine itself.

    Validate -> Register -> Provision -> ScaleUp -> (WaitForNodes -> NodesReady)* ->
    StartWorkers -> (WaitForWorkers -> WorkersHealthy)* ->
    OpenBaselinePhase -> PurgedBeforeBaseline -> EvaluateBaseline ->
    (WaitForBaselineEvaluation -> BaselineEvaluation)* ->
    OpenTrainingPhase -> PurgedBeforeTraining -> SubmitJob -> (WaitForJob -> Monitor -> JobDone?)* ->
    OpenFinalPhase -> PurgedBeforeFinal -> EvaluateFinal ->
    (WaitForFinalEvaluation -> FinalEvaluation)* ->
    Collect -> ReleaseCompute -> Teardown -> NotifySuccess -> RunSucceeded
    any step fails -> FailedIn<State> -> ReleaseComputeAfterFailure -> TeardownAfterFailure ->
    NotifyFailure -> RunFailed

Each phase (the baseline evaluation, training, the final evaluation) is opened before its job
starts: the router refuses what the phase before still sends, and the run's queues are emptied
of it, then the phase waits as long as SQS may take to finish the purge. An evaluation the run
cannot have (nothing held out, a plane that cannot evaluate) is skipped at once, its reason
kept. Every task retries Lambda's transient errors; every failure (a failed
evaluation too) releases the run's compute, tears its resources down, then notifies, then fails
with the original error and cause.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_stepfunctions as sfn
from aws_cdk import aws_stepfunctions_tasks as tasks
from constructs import Construct

from domain.backends import WAITING, Phase
from domain.episodes import TRAINING, EvaluationStage
from lambdas.pipeline.steps import STEP
from stacks.components.nag import Wildcard, acknowledge_no_resource_type, acknowledge_resource
from training_configs.schema import MAX_DEADLINE_HOURS

# Validation before a run's deadline starts, and release, teardown and notice after it passes.
AFTER_DEADLINE_HOURS = 2
RUN_PATH = "$.run.run_id"
RUN_ID = {"run_id.$": RUN_PATH}


class PipelineDefinition:
    """The states, made in `scope`, over the step functions by step name."""

    def __init__(self, scope: Construct, functions: Mapping[str, lambda_.IFunction]) -> None:
        self._scope, self._functions = scope, functions

    def task(
        self, state: str, function: str, payload: dict[str, Any] | None, result: str
    ) -> tasks.LambdaInvoke:
        invoke = tasks.LambdaInvoke(
            self._scope,
            state,
            lambda_function=self._functions[function],
            # None: no Parameters, so the function gets the whole state (upload, run, resources).
            payload=sfn.TaskInput.from_object(payload) if payload is not None else None,
            payload_response_only=True,
            result_path=result,
            retry_on_service_exceptions=True,
        )
        # Throttling is transient too: back off and try again.
        invoke.add_retry(
            errors=["Lambda.TooManyRequestsException"],
            interval=Duration.seconds(2),
            max_attempts=8,
            backoff_rate=2,
        )
        if STEP[function].retried_on_any_error:  # idempotent clean-up: worth a few more tries
            invoke.add_retry(
                errors=["States.ALL"], max_attempts=4, backoff_rate=2, interval=Duration.seconds(5)
            )
        return invoke

    def failure_path(self) -> sfn.IChainable:
        release = self.task("ReleaseComputeAfterFailure", "release_compute", None, "$.released")
        teardown = self.task(
            "TeardownAfterFailure", "teardown", {"run_id.$": "$.failure.run_id"}, "$.teardown"
        )
        notify = self.task(
            "NotifyFailure",
            "notify_end",
            {
                "run_id.$": "$.failure.run_id",
                "succeeded": False,
                "failed_state.$": "$.failure.state",
                "error.$": "$.error.Cause",
                "teardown.$": "$.teardown",
            },
            "$.notification",
        )
        failed = sfn.Fail(
            self._scope, "RunFailed", error_path="$.error.Error", cause_path="$.error.Cause"
        )
        # A failed notification must not replace the run's own error.
        notify.add_catch(failed, errors=["States.ALL"], result_path="$.notification_error")
        release.add_catch(teardown, errors=["States.ALL"], result_path="$.release_error")
        return release.next(teardown.next(notify.next(failed)))

    def caught(
        self, step: tasks.LambdaInvoke, run_id_path: str, failure: sfn.IChainable
    ) -> tasks.LambdaInvoke:
        """`step`, whose failure marks where the run failed and takes the failure path."""
        marker = sfn.Pass(
            self._scope,
            f"FailedIn{step.id}",
            parameters={"state": step.id, "run_id.$": run_id_path},
            result_path="$.failure",
        )
        marker.next(failure)
        step.add_catch(marker, errors=["States.ALL"], result_path="$.error")
        return step

    def poll_until(
        self, name: str, check: tasks.LambdaInvoke, result: str, ready: sfn.IChainable
    ) -> sfn.Wait:
        wait = sfn.Wait(
            self._scope, f"WaitFor{name}", time=sfn.WaitTime.seconds_path("$.run.poll_seconds")
        )
        wait.next(check).next(
            sfn.Choice(self._scope, f"{name}Ready?")
            .when(sfn.Condition.boolean_equals(f"{result}.ready", True), ready)
            .otherwise(wait)
        )
        return wait

    def opening(self, phase: str, failure: sfn.IChainable, then: sfn.IChainable) -> sfn.IChainable:
        """Open the run's `phase`, wait as long as emptying its queues asks, then `then`."""
        name = phase.title()
        payload = {"phase": phase, "state.$": "$"}
        opened = self.caught(
            self.task(f"Open{name}Phase", "open_phase", payload, "$.opened"), RUN_PATH, failure
        )
        purged = sfn.Wait(
            self._scope,
            f"PurgedBefore{name}",
            time=sfn.WaitTime.seconds_path("$.opened.wait_seconds"),
        )
        return opened.next(purged).next(then)

    def evaluation(
        self, stage: EvaluationStage, failure: sfn.IChainable, then: sfn.IChainable
    ) -> sfn.IChainable:
        """Start the evaluation of `stage` and poll it until it ended, then `then`; straight to
        `then` when it was skipped (ready at once)."""
        name, result = stage.value.title(), f"$.evaluations.{stage.value}"
        payload = {"stage": stage.value, "state.$": "$"}
        start = self.caught(
            self.task(f"Evaluate{name}", "start_evaluation", payload, result), RUN_PATH, failure
        )
        poll = self.caught(
            self.task(f"{name}Evaluation", "evaluation_status", payload, result), RUN_PATH, failure
        )
        return self.opening(
            stage.value,
            failure,
            start.next(
                sfn.Choice(self._scope, f"{name}EvaluationSkipped?")
                .when(sfn.Condition.boolean_equals(f"{result}.ready", True), then)
                .otherwise(self.poll_until(f"{name}Evaluation", poll, result, then))
            ),
        )

    def job_failed(self, failure: sfn.IChainable) -> sfn.IChainable:
        """The job ended without success: its phase and reason become the run's error."""
        return (
            sfn.Pass(
                self._scope,
                "JobDidNotSucceed",
                parameters={
                    "Error": "TrainingJobFailed",
                    "Cause.$": "States.Format('{}: {}', $.job.phase, $.job.reason)",
                },
                result_path="$.error",
            )
            .next(
                sfn.Pass(
                    self._scope,
                    "FailedInTrainingJob",
                    parameters={"state": "TrainingJob", "run_id.$": "$.run.run_id"},
                    result_path="$.failure",
                )
            )
            .next(failure)
        )

    def build(self) -> sfn.IChainable:
        failure = self.failure_path()
        caught, task = self.caught, self.task

        def compute(name: str, function: str, result: str) -> tasks.LambdaInvoke:
            return caught(task(name, function, None, result), "$.run.run_id", failure)

        validate = caught(
            task("Validate", "validate", {"upload.$": "$"}, "$.validation"),
            "$$.Execution.Name",
            failure,
        )
        register = caught(
            task("Register", "register", {"upload.$": "$"}, "$.run"), "$$.Execution.Name", failure
        )
        provision = caught(
            task("Provision", "provision", {"run.$": "$.run"}, "$.resources"),
            "$.run.run_id",
            failure,
        )
        teardown = task("Teardown", "teardown", RUN_ID, "$.teardown")
        caught(teardown, "$.run.run_id", failure)
        notify = caught(
            task(
                "NotifySuccess",
                "notify_end",
                {
                    **RUN_ID,
                    "succeeded": True,
                    "teardown.$": "$.teardown",
                    "evaluation.$": "$.results.evaluation",
                    "caution.$": "$.results.caution",
                },
                "$.notification",
            ),
            "$.run.run_id",
            failure,
        )
        release = compute("ReleaseCompute", "release_compute", "$.released")
        collect = caught(
            task(
                "Collect",
                "collect",
                {"state.$": "$", "execution_arn.$": "$$.Execution.Id"},
                "$.results",
            ),
            RUN_PATH,
            failure,
        )
        finish = (
            collect.next(release)
            .next(teardown)
            .next(notify)
            .next(sfn.Succeed(self._scope, "RunSucceeded"))
        )
        job_failed = self.job_failed(failure)
        monitor = compute("Monitor", "monitor", "$.job")
        job_wait = sfn.Wait(
            self._scope, "WaitForJob", time=sfn.WaitTime.seconds_path("$.run.poll_seconds")
        )
        job_wait.next(monitor).next(
            sfn.Choice(self._scope, "JobDone?")
            .when(
                sfn.Condition.string_equals("$.job.phase", Phase.SUCCEEDED),
                self.evaluation(EvaluationStage.FINAL, failure, finish),
            )
            .when(
                sfn.Condition.or_(
                    *(sfn.Condition.string_equals("$.job.phase", p) for p in WAITING)
                ),
                job_wait,
            )
            .otherwise(job_failed)
        )
        submit = self.opening(
            TRAINING, failure, compute("SubmitJob", "submit_job", "$.submitted").next(job_wait)
        )
        workers = compute("StartWorkers", "start_workers", "$.workers").next(
            self.poll_until(
                "Workers",
                compute("WorkersHealthy", "workers_healthy", "$.fleet"),
                "$.fleet",
                self.evaluation(EvaluationStage.BASELINE, failure, submit),
            )
        )
        nodes = compute("ScaleUp", "scale_up", "$.scaled").next(
            self.poll_until(
                "Nodes", compute("NodesReady", "nodes_ready", "$.nodes"), "$.nodes", workers
            )
        )
        return validate.next(register).next(provision).next(nodes)


def pipeline_state_machine(
    scope: Construct, *, name: str, functions: Mapping[str, lambda_.IFunction], log_key: kms.IKey
) -> tuple[sfn.StateMachine, logs.LogGroup]:
    """The state machine (and the log group of its executions' history, encrypted with
    `log_key`)."""
    definition = PipelineDefinition(scope, functions).build()
    log_group = logs.LogGroup(
        scope,
        "ExecutionLogs",
        retention=logs.RetentionDays.SIX_MONTHS,
        removal_policy=RemovalPolicy.DESTROY,
        encryption_key=log_key,
    )
    machine = sfn.StateMachine(
        scope,
        "StateMachine",
        state_machine_name=name,
        definition_body=sfn.DefinitionBody.from_chainable(definition),
        # Each run's deadline is enforced by the pipeline itself (Monitor, the waits, the
        # reaper), which then releases, tears down and notifies; the execution's own limit
        # is only a backstop and must outlast the longest deadline a config may set.
        timeout=Duration.hours(MAX_DEADLINE_HOURS + AFTER_DEADLINE_HOURS),
        tracing_enabled=True,
        logs=sfn.LogOptions(
            destination=log_group, level=sfn.LogLevel.ALL, include_execution_data=True
        ),
    )
    for function in functions.values():
        # Any version Lambda publishes of the pipeline's own functions.
        acknowledge_resource(machine.role, f"{function.function_arn}:*", Wildcard.ASSIGNED_BY_AWS)
    acknowledge_no_resource_type(machine.role)  # log delivery and X-Ray
    return machine, log_group
