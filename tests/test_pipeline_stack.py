"""The pipeline in the pipeline stack: upload rule, start function, state machine, grants."""

from __future__ import annotations

import importlib
import json
import re

import pytest
from pydantic import ValidationError

from domain.health import TRAINING_FIGURES
from lambdas.pipeline.training_metrics import EmbeddedMetrics
from stacks.components.experiment_tracking import LOG_ACTIONS
from stacks.components.pipeline_states import AFTER_DEADLINE_HOURS
from tests.conftest import Synthesized, as_list, handler_of, role_statements
from tests.pipeline.test_pipeline_definition import STEP_FUNCTIONS, function_arn, render_definition
from training_configs import load_training_config
from training_configs.schema import SHIPPED, TrainingConfig


def _definition(app: Synthesized) -> dict:
    """The state machine definition, with CloudFormation references replaced by placeholders."""
    _, machine = app.one("pipeline", "AWS::StepFunctions::StateMachine")
    separator, parts = machine["Properties"]["DefinitionString"]["Fn::Join"]
    text = separator.join(part if isinstance(part, str) else "REF" for part in parts)
    return json.loads(text)


def _functions(app: Synthesized) -> dict[str, tuple[str, dict]]:
    return {
        handler_of(fn).rsplit(".", 1)[-1]: (logical_id, fn)
        for logical_id, fn in app.resources("pipeline", "AWS::Lambda::Function").items()
        if handler_of(fn).startswith("lambdas.pipeline.")
    }


def test_every_step_handler_exists(default_app: Synthesized) -> None:
    functions = _functions(default_app)
    assert set(functions) == {
        "start_run",
        "validate",
        "register",
        "provision",
        "teardown",
        "notify_end",
        "reap",
        "scale_up",
        "nodes_ready",
        "start_workers",
        "workers_healthy",
        "open_phase",
        "submit_job",
        "monitor",
        "start_evaluation",
        "evaluation_status",
        "collect",
        "release_compute",
    }
    for name, (_, function) in _functions(default_app).items():
        module, attribute = handler_of(function).rsplit(".", 1)
        assert attribute == name and callable(getattr(importlib.import_module(module), attribute))


def test_the_deployed_machine_runs_the_pipeline_definition_with_the_stacks_functions(
    default_app: Synthesized,
) -> None:
    """tests/pipeline/test_pipeline_definition.py pins the definition state by state; here,
    the machine in the template is that definition, each step on its own function."""
    _, machine = default_app.one("pipeline", "AWS::StepFunctions::StateMachine")
    separator, parts = machine["Properties"]["DefinitionString"]["Fn::Join"]
    step_of = {logical_id: step for step, (logical_id, _) in _functions(default_app).items()}
    text = separator.join(
        part if isinstance(part, str) else function_arn(step_of[part["Fn::GetAtt"][0]])
        for part in parts
    )
    deployed = json.loads(text)
    rendered = render_definition({step: function_arn(step) for step in STEP_FUNCTIONS})
    assert (deployed["StartAt"], deployed["States"]) == (rendered["StartAt"], rendered["States"])


def test_state_machine_logs_everything_traces_and_times_out(default_app: Synthesized) -> None:
    _, machine = default_app.one("pipeline", "AWS::StepFunctions::StateMachine")
    properties = machine["Properties"]
    assert properties["LoggingConfiguration"]["Level"] == "ALL"
    assert properties["TracingConfiguration"] == {"Enabled": True}


def test_no_valid_run_is_cut_short_by_the_state_machines_own_limit(
    default_app: Synthesized,
) -> None:
    """The execution's limit is a backstop: every deadline a config may set, plus the release,
    teardown and notice after it, fits (a run past its deadline must end through the pipeline,
    torn down and notified, not TIMED_OUT)."""
    limit = _definition(default_app)["TimeoutSeconds"]
    after = AFTER_DEADLINE_HOURS * 3600
    for name in SHIPPED:  # rft_multiturn_full ships 24 h, twice the default's 12
        assert load_training_config(name).deadline_hours * 3600 + after <= limit, name
    longest = load_training_config("rft_multiturn_full").model_dump() | {"deadline_hours": 720}
    assert TrainingConfig.model_validate(longest).deadline_hours * 3600 + after <= limit
    with pytest.raises(ValidationError):  # ... and no valid config asks for more
        TrainingConfig.model_validate(longest | {"deadline_hours": 720.5})


def test_upload_rule_matches_jsonl_under_training_data_and_has_a_dlq(
    default_app: Synthesized,
) -> None:
    (rule,) = [
        r
        for r in default_app.resources("pipeline", "AWS::Events::Rule").values()
        if "EventPattern" in r["Properties"]
    ]
    pattern = rule["Properties"]["EventPattern"]
    assert pattern["source"] == ["aws.s3"] and pattern["detail-type"] == ["Object Created"]
    assert pattern["detail"]["object"]["key"] == [{"wildcard": "training-data/*.jsonl"}]
    assert "nova-mtrl-data-" in json.dumps(pattern["detail"]["bucket"]["name"])
    (target,) = rule["Properties"]["Targets"]
    start_id, _ = _functions(default_app)["start_run"]
    assert target["Arn"] == {"Fn::GetAtt": [start_id, "Arn"]} and "DeadLetterConfig" in target
    # EventBridge cannot deliver to a queue under the AWS managed key alias/aws/sqs (EventBridge
    # User Guide, "Using dead-letter queues"): the dead-letter queue is SQS-managed.
    (dlq_id,) = [v for v in target["DeadLetterConfig"]["Arn"].values()][0][:1]
    queue = default_app.template("pipeline")["Resources"][dlq_id]["Properties"]
    assert queue.get("SqsManagedSseEnabled") is True and "KmsMasterKeyId" not in queue


def test_step_permissions_are_scoped(default_app: Synthesized) -> None:
    template = default_app.template("pipeline")
    grants = {}
    for name, (_, function) in _functions(default_app).items():
        role_id = function["Properties"]["Role"]["Fn::GetAtt"][0]
        grants[name] = {
            action: json.dumps(statement["Resource"])
            for statement in role_statements(template, role_id)
            for action in as_list(statement["Action"])
        }
    assert re.search(r"training-data/\*", grants["validate"]["s3:GetObjectVersion"])
    assert "s3:GetObject" not in grants["validate"]  # only the version that started the run
    assert (
        re.search(r"runs/\*", grants["validate"]["s3:PutObject"])
        and "s3:PutObject" not in grants["register"]
    )
    assert (
        ":nova-mtrl-run-*" in grants["provision"]["sqs:CreateQueue"]
        and "sqs:DeleteQueue" not in grants["provision"]
    )
    assert (
        ":nova-mtrl-run-*" in grants["teardown"]["sqs:DeleteQueue"]
        and "sqs:CreateQueue" not in grants["teardown"]
    )
    assert "sns:Publish" in grants["notify_end"] and "states:StartExecution" in grants["start_run"]
    # The monitor reads the trainer's metrics (its last step) and writes a Nova run's (from its
    # rollout reports): under runs/ only, and deletes nothing.
    assert re.search(r"runs/\*", grants["monitor"]["s3:GetObject"])
    assert re.search(r"runs/\*", grants["monitor"]["s3:PutObject"])
    assert not any(action.startswith("s3:Delete") for action in grants["monitor"])
    # It queries the conversations (a Nova run's reports) and writes only the run's record (its
    # health warnings), never a conversation.
    assert "Conversations" in grants["monitor"]["dynamodb:Query"]
    puts = grants["monitor"]["dynamodb:PutItem"]
    assert "Runs" in puts and "Conversations" not in puts, puts


def test_a_reaper_runs_every_quarter_hour(default_app: Synthesized) -> None:
    (schedule,) = [
        r
        for r in default_app.resources("pipeline", "AWS::Events::Rule").values()
        if "ScheduleExpression" in r["Properties"]
    ]
    assert schedule["Properties"]["ScheduleExpression"] == "rate(15 minutes)"
    reaper_id, _ = _functions(default_app)["reap"]
    assert schedule["Properties"]["Targets"][0]["Arn"] == {"Fn::GetAtt": [reaper_id, "Arn"]}
    # `mtrl teardown` finds it by the stack's output.
    outputs = default_app.template("pipeline")["Outputs"]
    assert outputs["ReaperFunctionName"]["Value"] == {"Ref": reaper_id}


def test_alarms_reach_the_alert_topic(default_app: Synthesized) -> None:
    alarms = default_app.resources("pipeline", "AWS::CloudWatch::Alarm").values()
    topic_id, _ = default_app.one("pipeline", "AWS::SNS::Topic")
    names = {alarm["Properties"]["MetricName"] for alarm in alarms}
    assert {
        "ExecutionsFailed",
        "ExecutionsTimedOut",
        "ApproximateNumberOfMessagesVisible",
        "Errors",
    } <= names
    assert all(alarm["Properties"]["AlarmActions"] == [{"Ref": topic_id}] for alarm in alarms)
    assert sum(1 for alarm in alarms if alarm["Properties"]["MetricName"] == "Errors") == 18


def test_dashboard_shows_runs_step_errors_and_queue_ages(default_app: Synthesized) -> None:
    _, dashboard = default_app.one("pipeline", "AWS::CloudWatch::Dashboard")
    body = json.dumps(dashboard["Properties"]["DashboardBody"])
    for title in (
        "Runs (executions)",
        "Step errors",
        "Run queues: oldest message age",
        "Upload events dead-lettered",
    ):
        assert title in body
    assert "ApproximateAgeOfOldestMessage" in body and "nova-mtrl-" in body


def test_dashboard_graphs_what_monitor_publishes_of_each_run(
    default_app: Synthesized, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each training figure is searched for under the namespace and the very dimensions of the
    documents Monitor writes (a search naming other dimensions finds nothing)."""
    EmbeddedMetrics("nova-mtrl").publish("r", 1, dict.fromkeys(TRAINING_FIGURES, 0.5))
    (document,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    (directive,) = document["_aws"]["CloudWatchMetrics"]
    (dimensions,) = directive["Dimensions"]
    _, dashboard = default_app.one("pipeline", "AWS::CloudWatch::Dashboard")
    body = json.loads(
        "".join(p if isinstance(p, str) else "X" for p in dashboard["Properties"]["DashboardBody"]["Fn::Join"][1])
    )  # fmt: skip
    searches = [
        metric[0]["expression"]
        for widget in body["widgets"]
        for metric in widget["properties"].get("metrics", [])
        if "expression" in metric[0] and directive["Namespace"] in metric[0]["expression"]
    ]
    schema = "{" + ",".join([directive["Namespace"], *sorted(dimensions)]) + "}"
    searched = {re.search(r'MetricName="(\w+)"', search)[1] for search in searches}
    assert searched == {m["Name"] for m in directive["Metrics"]} == set(TRAINING_FIGURES)
    assert all(search.startswith(f"SEARCH('{schema} ") for search in searches)
    assert all(f'deployment="nova-mtrl" service="{document["service"]}"' in s for s in searches)


def _notify_end(app: Synthesized) -> tuple[dict, list[dict]]:
    """NotifyEnd's function and its role's statements."""
    template = app.template("pipeline")
    ((_, function),) = [
        (key, resource)
        for key, resource in app.resources("pipeline", "AWS::Lambda::Function").items()
        if key.startswith("PipelineNotifyEndFunction")
    ]
    role_id = function["Properties"]["Role"]["Fn::GetAtt"][0]
    return function, role_statements(template, role_id)


def test_without_an_mlflow_server_nothing_is_made_or_granted(default_app: Synthesized) -> None:
    assert default_app.resources("pipeline", "AWS::SageMaker::MlflowTrackingServer") == {}
    function, statements = _notify_end(default_app)
    assert "MLFLOW_TRACKING_SERVER_ARN" not in function["Properties"]["Environment"]["Variables"]
    assert not [s for s in statements if "sagemaker-mlflow" in json.dumps(s["Action"])]


def test_an_mlflow_server_keeps_its_files_in_the_data_bucket_and_notify_end_logs_to_it(
    nova_app: Synthesized,
) -> None:
    (server_id, server), *others = nova_app.resources(
        "pipeline", "AWS::SageMaker::MlflowTrackingServer"
    ).items()
    assert others == []
    properties = server["Properties"]
    assert (
        properties["TrackingServerSize"] == "Small"
        and properties["TrackingServerName"] == "nova-mtrl"
    )
    assert properties["ArtifactStoreUri"]["Fn::Join"][1][-1] == "/mlflow/"
    assert properties["AutomaticModelRegistration"] is False
    role = nova_app.template("pipeline")["Resources"][properties["RoleArn"]["Fn::GetAtt"][0]]
    (trust,) = role["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert trust["Principal"] == {"Service": "sagemaker.amazonaws.com"}
    function, statements = _notify_end(nova_app)
    arn = function["Properties"]["Environment"]["Variables"]["MLFLOW_TRACKING_SERVER_ARN"]
    assert "mlflow-tracking-server/nova-mtrl" in json.dumps(arn)
    (logging,) = [s for s in statements if "sagemaker-mlflow" in json.dumps(s["Action"])]
    assert sorted(as_list(logging["Action"])) == sorted(LOG_ACTIONS)
    assert logging["Resource"] == arn  # that server only
