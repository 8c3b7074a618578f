"""How the Lambda code is put together: every function's settings are read from its environment
once, when its module loads; its AWS clients come from one session; its compute planes are
given where its steps are composed — so local mode binds its own by composing, nothing patches
the environment, and functions can run side by side."""

from __future__ import annotations

import ast
import importlib
import json
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import get_type_hints

import boto3
import pytest
from pydantic import BaseModel, ValidationError

from domain.nova_job import submitted_recipe_key
from domain.run_state import Validation
from domain.runs import RunRecord, RunStore
from lambdas.clients import Clients
from lambdas.environment import environment_for
from lambdas.pipeline import handlers
from lambdas.pipeline.composition import at_the_boundary, compose, step_bodies
from lambdas.pipeline.compute import ComputeSteps
from lambdas.pipeline.reaper import Reaper
from lambdas.pipeline.run_steps import RunSteps, Upload
from lambdas.pipeline.settings import PipelineSettings
from lambdas.pipeline.steps import STEP
from mtrl.local.embedded import Dispatcher
from tests.aws import create_runs_table
from training_configs.schema import load_training_config

LAMBDAS = Path(__file__).resolve().parents[2] / "lambdas"
ENVIRONMENT = {
    "NAME_PREFIX": "nova-mtrl",
    "RUNS_TABLE": "runs-at-load",
    "CONVERSATIONS_TABLE": "conversations",
    "CONSUMER_FUNCTION": "consumer",
    "ROLLOUT_LAMBDA_ARN": "arn:aws:lambda:us-east-1:123456789012:function:rollout-forwarder",
}


def registered(bucket: str = "b", **fields: object) -> object:
    """The runs table with run "r" in it (a Wordle upload, config "c"); its client."""
    db = boto3.client("dynamodb")
    create_runs_table(db, "runs-at-load")
    RunStore(db, "runs-at-load").register(
        RunRecord(
            run_id="r", bucket=bucket, key="training-data/x.jsonl", config_name="c",
            created_at=0.0, updated_at=0.0, deadline_at=3600.0, cost_per_hour=1.0,
            **fields,  # type: ignore[arg-type]
        )
    )  # fmt: skip
    return db


def test_every_step_of_the_table_has_an_entry_point_and_a_body() -> None:
    steps = compose(ENVIRONMENT, Clients(boto3.Session(region_name="us-east-1")))
    assert set(steps) == set(STEP)
    # Lambda's runtime finds `lambdas.pipeline.handlers.<step>` by name.
    assert all(getattr(handlers, name).__name__ == name for name in STEP)
    with pytest.raises(AttributeError, match="no step 'colect'.*steps.py"):
        handlers.colect  # noqa: B018
    # Every public method of the step classes is a step of the table: no body is left unused.
    methods = {
        name
        for step_class in (RunSteps, ComputeSteps, Reaper)
        for name, value in vars(step_class).items()
        if callable(value) and not name.startswith("_")
    }
    assert methods == set(STEP)
    # Each returns a typed result: what the state machine's paths read, or its caller parses.
    returned = {
        name: get_type_hints(getattr(step_class, name))["return"]
        for step_class in (RunSteps, ComputeSteps, Reaper)
        for name in STEP
        if hasattr(step_class, name)
    }
    untyped = [
        name
        for name, kind in returned.items()
        if not (isinstance(kind, type) and issubclass(kind, BaseModel))
    ]
    assert untyped == []


class _Steps:
    def validate(self, upload: Upload) -> Validation:
        return Validation(run_id=upload.run_id, records=1, report_key="k")


def test_a_step_no_class_has_or_two_have_is_refused_when_composed() -> None:
    with pytest.raises(LookupError, match="step 'register' .*0 of the step classes"):
        step_bodies(_Steps())
    everything = {name: lambda event: event for name in STEP}
    with pytest.raises(LookupError, match="step 'validate' .*2 of the step classes"):
        step_bodies(SimpleNamespace(**everything), _Steps())


def test_at_the_boundary_an_event_is_parsed_into_the_steps_type_and_its_result_dumped() -> None:
    validate = at_the_boundary(_Steps().validate)
    upload = {"bucket": "b", "key": "training-data/x.jsonl", "version_id": None}
    # The state machine's payload (`{"upload.$": "$"}`) and the upload itself: one type.
    assert validate({"upload": upload}) == validate(upload) == {
        "run_id": Upload.model_validate(upload).run_id, "records": 1, "report_key": "k",
    }  # fmt: skip
    with pytest.raises(ValidationError, match=r"(?s)key\n  Field required"):
        validate({"upload": {"bucket": "b"}})


def test_an_entry_point_reads_its_environment_once_when_it_loads(
    aws: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = registered()
    for key, value in ENVIRONMENT.items():
        monkeypatch.setenv(key, value)
    entry = importlib.reload(handlers)  # as Lambda loads it, with the function's environment
    monkeypatch.setenv("RUNS_TABLE", "a-table-that-does-not-exist")
    told = entry.notify_end({"run_id": "r", "succeeded": True}, None)
    assert told["status"] == "SUCCEEDED"
    assert RunStore(db, "runs-at-load").get("r").status == "succeeded"


def _violations(tree: ast.AST) -> list[str]:
    """`os.environ` read inside a function, or a client of boto3's default session."""
    found = []

    def visit(node: ast.AST, in_function: bool) -> None:
        inside = in_function or isinstance(
            node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
        )
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            name = f"{node.value.id}.{node.attr}"
            if (name == "os.environ" and inside) or name in ("boto3.client", "boto3.resource"):
                found.append(f"line {node.lineno}: {name}")
        for child in ast.iter_child_nodes(node):
            visit(child, inside)

    visit(tree, False)
    return found


def test_no_lambda_code_reads_the_environment_after_load_or_uses_the_default_session() -> None:
    found = {
        str(path.relative_to(LAMBDAS)): problems
        for path in sorted(LAMBDAS.rglob("*.py"))
        if (problems := _violations(ast.parse(path.read_text())))
    }
    assert found == {}


def test_the_check_sees_both() -> None:
    source = "import os, boto3\nA = os.environ\ndef f():\n    return os.environ['X'], boto3.client('s3')\n"
    assert _violations(ast.parse(source)) == ["line 4: os.environ", "line 4: boto3.client"]


def test_local_functions_run_side_by_side() -> None:
    """One function waits for another to run: they would deadlock if the dispatcher ran one
    function at a time (as it did while functions shared os.environ)."""
    other_ran = threading.Event()
    dispatcher = Dispatcher()
    dispatcher.add("waits", "lambdas.pipeline.handlers.monitor", lambda e: other_ran.wait(10))
    dispatcher.add("other", "lambdas.pipeline.handlers.collect", lambda e: other_ran.set())
    waited: list[bool] = []
    waiting = threading.Thread(target=lambda: waited.append(dispatcher.call("waits", {})))
    waiting.start()
    dispatcher.call("other", {})
    waiting.join(timeout=10)
    assert waited == [True] and dispatcher.invocations == ["monitor", "collect"]


def test_the_stacks_write_an_environment_the_settings_read_back() -> None:
    """Variable names have one home, the settings model: what `environment_for` writes (as the
    constructs do) is what the model reads; a field the model lacks is refused."""
    written = environment_for(
        PipelineSettings, name_prefix="p", runs_table="r", conversations_table="c",
        consumer_function="f", rollout_lambda_arn="g", poll_seconds=5,
    )  # fmt: skip
    assert written["RUNS_TABLE"] == "r" and written["POLL_SECONDS"] == "5"
    settings = PipelineSettings.from_environment(written)
    assert (settings.runs_table, settings.poll_seconds) == ("r", 5)
    with pytest.raises(KeyError, match="PipelineSettings has no field runs_tabel"):
        environment_for(PipelineSettings, runs_tabel="r")


def test_the_held_out_caution_joins_the_runs_health_warnings(aws: None) -> None:
    db = registered(health={"env_error_rate": "run health: 12% ..."})
    notify_end = compose(ENVIRONMENT, Clients(boto3.Session(region_name="us-east-1")))["notify_end"]
    caution = "run health: the training reward rose by +0.30 but held-out pass@1 did not (+0.00)"
    told = notify_end({"run_id": "r", "succeeded": True, "caution": caution})
    assert told["health"] == ["run health: 12% ...", caution]
    assert RunStore(db, "runs-at-load").get("r").health == {
        "env_error_rate": "run health: 12% ...", "held_out": caution,
    }  # fmt: skip


def test_a_tracking_server_that_fails_never_fails_the_run(aws: None) -> None:
    """NotifySuccess ends a run that succeeded: MLflow refusing (or absent) is said in the
    notification, not raised."""
    db = registered(bucket="data-b", config=load_training_config("rft_multiturn_lora"))
    boto3.client("s3").create_bucket(Bucket="data-b")
    environment = {
        **ENVIRONMENT,
        "MLFLOW_TRACKING_SERVER_ARN": "arn:aws:sagemaker:us-east-1:123456789012:mlflow-tracking-server/x",
        "MLFLOW_ENDPOINT": "http://127.0.0.1:9",  # nothing listens there
    }
    session = boto3.Session(
        region_name="us-east-1", aws_access_key_id="k", aws_secret_access_key="s"
    )
    told = compose(environment, Clients(session))["notify_end"]({"run_id": "r", "succeeded": True})
    assert told["status"] == "SUCCEEDED" and told["tracking"].startswith("not tracked: MLflow ")
    assert RunStore(db, "runs-at-load").get("r").status == "succeeded"


def test_what_a_run_did_without_is_in_its_record_and_its_notice(aws: None) -> None:
    """A Nova run's recipes that skipped overrides (the records its plane keeps) and an
    evaluation it had to skip: each one line, on the run's record and in the notification; a job
    whose recipe took every override says nothing."""
    db = registered(bucket="data-b")
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="data-b")
    for job, skipped in (("r-train", ["rollout_request_queue_url", "alpha"]), ("r-eval", [])):
        record = {"job": job, "skipped": skipped, "recipe": {}}
        s3.put_object(
            Bucket="data-b", Key=submitted_recipe_key("runs/r/", job), Body=json.dumps(record)
        )
    evaluation = {"skipped": {"baseline": "no record fell in the held-out share"}}
    s3.put_object(Bucket="data-b", Key="runs/r/evaluation.json", Body=json.dumps(evaluation))
    sns = boto3.client("sns")
    topic = sns.create_topic(Name="alerts")["TopicArn"]
    sqs = boto3.client("sqs")
    inbox = sqs.create_queue(QueueName="inbox")["QueueUrl"]
    inbox_arn = sqs.get_queue_attributes(QueueUrl=inbox, AttributeNames=["QueueArn"])
    sns.subscribe(
        TopicArn=topic, Protocol="sqs", Endpoint=inbox_arn["Attributes"]["QueueArn"],
        Attributes={"RawMessageDelivery": "true"},
    )  # fmt: skip
    environment = {**ENVIRONMENT, "ALERT_TOPIC_ARN": topic}
    told = compose(environment, Clients(boto3.Session(region_name="us-east-1")))["notify_end"](
        {"run_id": "r", "succeeded": True}
    )
    notes = [
        "the recipe of job r-train has no rollout_request_queue_url, alpha: skipped, as the "
        "Forge SDK skips an override its recipe lacks",
        "baseline evaluation skipped: no record fell in the held-out share",
    ]
    assert told["notes"] == notes
    assert RunStore(db, "runs-at-load").get("r").notes == notes
    (message,) = sqs.receive_message(QueueUrl=inbox)["Messages"]
    head = message["Body"].split("\n\n", 1)[0]
    assert [line for line in head.splitlines() if line.startswith("note: ")] == [
        f"note: {note}" for note in notes
    ]
