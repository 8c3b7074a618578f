"""The pipeline's state machine definition, rendered from `PipelineDefinition` alone (no stack,
no synth): every state, what it runs with which input, where its result goes, how it retries,
and where a failure takes the run — the release, teardown and notice that must follow any
failure, and the polls that must not end early. The stack test checks the deployed machine runs
this same definition."""

from __future__ import annotations

from typing import Any

import pytest
from aws_cdk import App, Stack
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_stepfunctions as sfn

from stacks.components.pipeline_states import PipelineDefinition

STEP_FUNCTIONS = (
    "validate", "register", "provision", "scale_up", "nodes_ready", "start_workers",
    "workers_healthy", "open_phase", "start_evaluation", "evaluation_status", "submit_job",
    "monitor",
    "collect", "release_compute", "teardown", "notify_end",
)  # fmt: skip


def function_arn(name: str) -> str:
    return f"arn:aws:lambda:us-east-1:123456789012:function:{name}"


def render_definition(functions: dict[str, str]) -> dict[str, Any]:
    """The definition's states language, each step function named by `functions[step]`."""
    stack = Stack(App(), "Definition")
    imported = {
        step: lambda_.Function.from_function_arn(stack, step, arn)
        for step, arn in functions.items()
    }
    chain = PipelineDefinition(stack, imported).build()
    return sfn.StateGraph(chain.start_state, "Pipeline").to_graph_json()


@pytest.fixture
def states() -> dict[str, dict[str, Any]]:
    """Rendered for each test (not once per module): `make mutate` maps each test to the
    builder code it runs."""
    definition = render_definition({step: function_arn(step) for step in STEP_FUNCTIONS})
    assert definition["StartAt"] == "Validate"
    return definition["States"]


RUN_ID = {"run_id.$": "$.run.run_id"}
# CDK's retry of Lambda's own transient errors (LambdaInvoke retry_on_service_exceptions).
TRANSIENT = {
    "ErrorEquals": [
        "Lambda.ClientExecutionTimeoutException",
        "Lambda.ServiceException",
        "Lambda.AWSLambdaException",
        "Lambda.SdkClientException",
    ],
    "IntervalSeconds": 2,
    "MaxAttempts": 6,
    "BackoffRate": 2,
}
THROTTLED = {
    "ErrorEquals": ["Lambda.TooManyRequestsException"],
    "IntervalSeconds": 2,
    "MaxAttempts": 8,
    "BackoffRate": 2,
}
ANY_ERROR = {
    "ErrorEquals": ["States.ALL"],
    "IntervalSeconds": 5,
    "MaxAttempts": 4,
    "BackoffRate": 2,
}

# state: (function, its input (None: the whole state), where its result goes, next state,
#         the run id its failure marker records, whether any error is retried)
STEPS: dict[str, tuple[str, dict | None, str, str, str, bool]] = {
    "Validate": ("validate", {"upload.$": "$"}, "$.validation", "Register",
                 "$$.Execution.Name", False),
    "Register": ("register", {"upload.$": "$"}, "$.run", "Provision", "$$.Execution.Name", False),
    "Provision": ("provision", {"run.$": "$.run"}, "$.resources", "ScaleUp", "$.run.run_id",
                  False),
    "ScaleUp": ("scale_up", None, "$.scaled", "WaitForNodes", "$.run.run_id", False),
    "NodesReady": ("nodes_ready", None, "$.nodes", "NodesReady?", "$.run.run_id", False),
    "StartWorkers": ("start_workers", None, "$.workers", "WaitForWorkers", "$.run.run_id", False),
    "WorkersHealthy": ("workers_healthy", None, "$.fleet", "WorkersReady?", "$.run.run_id",
                       False),
    **{
        f"Open{phase.title()}Phase": ("open_phase", {"phase": phase, "state.$": "$"}, "$.opened",
                                      f"PurgedBefore{phase.title()}", "$.run.run_id", False)
        for phase in ("baseline", "training", "final")
    },
    "EvaluateBaseline": ("start_evaluation", {"stage": "baseline", "state.$": "$"},
                         "$.evaluations.baseline", "BaselineEvaluationSkipped?", "$.run.run_id",
                         False),
    "BaselineEvaluation": ("evaluation_status", {"stage": "baseline", "state.$": "$"},
                           "$.evaluations.baseline", "BaselineEvaluationReady?", "$.run.run_id",
                           False),
    "EvaluateFinal": ("start_evaluation", {"stage": "final", "state.$": "$"},
                      "$.evaluations.final", "FinalEvaluationSkipped?", "$.run.run_id", False),
    "FinalEvaluation": ("evaluation_status", {"stage": "final", "state.$": "$"},
                        "$.evaluations.final", "FinalEvaluationReady?", "$.run.run_id", False),
    "SubmitJob": ("submit_job", None, "$.submitted", "WaitForJob", "$.run.run_id", False),
    "Monitor": ("monitor", None, "$.job", "JobDone?", "$.run.run_id", False),
    "Collect": ("collect", {"state.$": "$", "execution_arn.$": "$$.Execution.Id"}, "$.results",
                "ReleaseCompute", "$.run.run_id", False),
    "ReleaseCompute": ("release_compute", None, "$.released", "Teardown", "$.run.run_id", True),
    "Teardown": ("teardown", RUN_ID, "$.teardown", "NotifySuccess", "$.run.run_id", True),
    "NotifySuccess": (
        "notify_end",
        {**RUN_ID, "succeeded": True, "teardown.$": "$.teardown",
         "evaluation.$": "$.results.evaluation", "caution.$": "$.results.caution"},
        "$.notification", "RunSucceeded", "$.run.run_id", False,
    ),
}  # fmt: skip


def _task(function: str, payload: dict | None, result: str, retried: bool) -> dict[str, Any]:
    state = {
        "Type": "Task",
        "Resource": function_arn(function),
        "ResultPath": result,
        "Retry": [TRANSIENT, THROTTLED, *([ANY_ERROR] if retried else [])],
    }
    return {**state, "Parameters": payload} if payload is not None else state


@pytest.mark.parametrize("name", list(STEPS))
def test_each_step_runs_its_function_and_any_failure_marks_where_then_cleans_up(
    states: dict, name: str
) -> None:
    function, payload, result, following, run_id, retried = STEPS[name]
    assert states[name] == {
        **_task(function, payload, result, retried),
        "Next": following,
        "Catch": [{"ErrorEquals": ["States.ALL"], "ResultPath": "$.error",
                   "Next": f"FailedIn{name}"}],
    }  # fmt: skip
    assert states[f"FailedIn{name}"] == {
        "Type": "Pass",
        "Parameters": {"state": name, "run_id.$": run_id},
        "ResultPath": "$.failure",
        "Next": "ReleaseComputeAfterFailure",
    }


def test_the_polls_wait_by_the_runs_interval_until_ready(states: dict) -> None:
    for name, check, field, then in (
        ("Nodes", "NodesReady", "nodes", "StartWorkers"),
        ("Workers", "WorkersHealthy", "fleet", "OpenBaselinePhase"),
        ("BaselineEvaluation", "BaselineEvaluation", "evaluations.baseline", "OpenTrainingPhase"),
        ("FinalEvaluation", "FinalEvaluation", "evaluations.final", "Collect"),
    ):
        assert states[f"WaitFor{name}"] == {
            "Type": "Wait", "SecondsPath": "$.run.poll_seconds", "Next": check,
        }  # fmt: skip
        assert states[f"{name}Ready?"] == {
            "Type": "Choice",
            "Choices": [{"Variable": f"$.{field}.ready", "BooleanEquals": True, "Next": then}],
            "Default": f"WaitFor{name}",
        }


def test_each_phase_starts_its_job_only_after_its_queues_were_emptied(states: dict) -> None:
    """Baseline evaluation, training, final evaluation: each is opened (the router refuses the
    phase before, its queues are purged), then waits what the purge asked, then starts."""
    for phase, starts in (
        ("Baseline", "EvaluateBaseline"), ("Training", "SubmitJob"), ("Final", "EvaluateFinal"),
    ):  # fmt: skip
        assert states[f"PurgedBefore{phase}"] == {
            "Type": "Wait", "SecondsPath": "$.opened.wait_seconds", "Next": starts,
        }  # fmt: skip


def test_the_job_is_polled_while_pending_or_running_and_anything_else_but_success_fails(
    states: dict,
) -> None:
    assert states["WaitForJob"] == {
        "Type": "Wait", "SecondsPath": "$.run.poll_seconds", "Next": "Monitor",
    }  # fmt: skip
    phase = "$.job.phase"
    assert states["JobDone?"] == {
        "Type": "Choice",
        "Choices": [
            {"Variable": phase, "StringEquals": "succeeded", "Next": "OpenFinalPhase"},
            {
                "Or": [
                    {"Variable": phase, "StringEquals": "pending"},
                    {"Variable": phase, "StringEquals": "running"},
                ],
                "Next": "WaitForJob",
            },
        ],
        "Default": "JobDidNotSucceed",
    }
    assert states["JobDidNotSucceed"] == {
        "Type": "Pass",
        "Parameters": {
            "Error": "TrainingJobFailed",
            "Cause.$": "States.Format('{}: {}', $.job.phase, $.job.reason)",
        },
        "ResultPath": "$.error",
        "Next": "FailedInTrainingJob",
    }
    assert states["FailedInTrainingJob"] == {
        "Type": "Pass",
        "Parameters": {"state": "TrainingJob", "run_id.$": "$.run.run_id"},
        "ResultPath": "$.failure",
        "Next": "ReleaseComputeAfterFailure",
    }


def test_a_skipped_evaluation_goes_straight_on_and_a_started_one_is_polled(states: dict) -> None:
    """An evaluation the run cannot have is ready at once: no wait, the run goes on."""
    for stage, then in (("Baseline", "OpenTrainingPhase"), ("Final", "Collect")):
        assert states[f"{stage}EvaluationSkipped?"] == {
            "Type": "Choice",
            "Choices": [
                {
                    "Variable": f"$.evaluations.{stage.lower()}.ready",
                    "BooleanEquals": True,
                    "Next": then,
                }
            ],
            "Default": f"WaitFor{stage}Evaluation",
        }


def test_after_a_failure_compute_is_released_then_torn_down_then_noticed_then_failed(
    states: dict,
) -> None:
    """Release is retried and, if it still fails, teardown runs anyway; a failed notice does
    not replace the run's own error, which the run fails with."""
    assert states["ReleaseComputeAfterFailure"] == {
        **_task("release_compute", None, "$.released", retried=True),
        "Next": "TeardownAfterFailure",
        "Catch": [{"ErrorEquals": ["States.ALL"], "ResultPath": "$.release_error",
                   "Next": "TeardownAfterFailure"}],
    }  # fmt: skip
    assert states["TeardownAfterFailure"] == {
        **_task("teardown", {"run_id.$": "$.failure.run_id"}, "$.teardown", retried=True),
        "Next": "NotifyFailure",
    }
    assert states["NotifyFailure"] == {
        **_task(
            "notify_end",
            {
                "run_id.$": "$.failure.run_id",
                "succeeded": False,
                "failed_state.$": "$.failure.state",
                "error.$": "$.error.Cause",
                "teardown.$": "$.teardown",
            },
            "$.notification",
            retried=False,
        ),
        "Next": "RunFailed",
        "Catch": [{"ErrorEquals": ["States.ALL"], "ResultPath": "$.notification_error",
                   "Next": "RunFailed"}],
    }  # fmt: skip
    assert states["RunFailed"] == {
        "Type": "Fail", "ErrorPath": "$.error.Error", "CausePath": "$.error.Cause",
    }  # fmt: skip
    assert states["RunSucceeded"] == {"Type": "Succeed"}


def test_there_is_no_state_but_these(states: dict) -> None:
    expected = {
        *STEPS,
        *(f"FailedIn{name}" for name in (*STEPS, "TrainingJob")),
        "WaitForNodes", "NodesReady?", "WaitForWorkers", "WorkersReady?", "WaitForJob",
        "PurgedBeforeBaseline", "PurgedBeforeTraining", "PurgedBeforeFinal",
        "BaselineEvaluationSkipped?", "WaitForBaselineEvaluation", "BaselineEvaluationReady?",
        "FinalEvaluationSkipped?", "WaitForFinalEvaluation", "FinalEvaluationReady?",
        "JobDone?", "JobDidNotSucceed", "ReleaseComputeAfterFailure", "TeardownAfterFailure",
        "NotifyFailure", "RunFailed", "RunSucceeded",
    }  # fmt: skip
    assert set(states) == expected
