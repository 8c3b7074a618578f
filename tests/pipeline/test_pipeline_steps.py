"""Pipeline steps under moto: run identity and registration, streaming validation from S3,
provisioning and idempotent teardown of a run's router resources."""

from __future__ import annotations

import json
import string

import boto3
import pytest
from botocore.exceptions import ClientError
from hypothesis import example, given, settings
from hypothesis import strategies as st

from domain.runs import RunRecord, RunStore, run_id_for
from lambdas.pipeline.resources import (
    RouterWiring,
    leftover_resources,
    provision_run,
    teardown_run,
)
from lambdas.pipeline.validate import validate_upload
from tests.aws import create_runs_table

BUCKET = "data-bucket"
GOOD = b'{"id": "a", "metadata": {"prompt": "p", "answer": "crane"}}\n{"id": "b", "metadata": {"prompt": "p"}}\n'


@pytest.fixture
def bucket(aws: None) -> None:
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket=BUCKET)
    s3.put_bucket_versioning(Bucket=BUCKET, VersioningConfiguration={"Status": "Enabled"})


def test_run_ids_are_stable_per_upload_and_new_per_version() -> None:
    first = run_id_for(BUCKET, "training-data/My Wordle set.jsonl", "v1")
    assert first == run_id_for(BUCKET, "training-data/My Wordle set.jsonl", "v1")
    assert first.startswith("my-wordle-set-") and len(first) <= 64
    assert first != run_id_for(BUCKET, "training-data/My Wordle set.jsonl", "v2")
    assert all(
        c.isalnum() or c == "-" for c in run_id_for(BUCKET, "training-data/ü ß/..jsonl", None)
    )


# StartExecution's `name` (botocore's stepfunctions model): the run id names the execution.
EXECUTION_NAME = (
    boto3.client("stepfunctions", region_name="us-east-1")
    .meta.service_model.operation_model("StartExecution")
    .input_shape.members["name"]
    .metadata
)


KEY_CHARACTERS = string.ascii_letters + string.digits + " -_.üß€"


@settings(max_examples=60, deadline=None)
@example(key=f"training-data/{'Wordle games ' * 20}.jsonl", version="v1")  # a long name
@given(
    key=st.text(KEY_CHARACTERS, min_size=1, max_size=300).map(
        lambda name: f"training-data/{name}.jsonl"
    ),
    version=st.none() | st.text(min_size=1, max_size=40),
)
def test_any_upload_gets_an_execution_name_unique_per_bucket(key: str, version: str | None) -> None:
    """Whatever the key, the id is a valid execution name and at most 64 characters (so queue
    names stay readable); the same key and version in another bucket is another run."""
    run_id = run_id_for(BUCKET, key, version)
    assert EXECUTION_NAME["min"] <= len(run_id) <= min(64, EXECUTION_NAME["max"])
    assert all(c.isascii() and (c.isalnum() or c == "-") for c in run_id)
    assert run_id != run_id_for(f"{BUCKET}-2", key, version)


def _run(run_id: str = "r-1") -> RunRecord:
    return RunRecord(
        run_id=run_id,
        bucket=BUCKET,
        key="training-data/x.jsonl",
        version_id="v1",
        config_name="rft_multiturn_lora",
        created_at=1.0,
        updated_at=1.0,
        deadline_at=100.0,
    )


def test_a_duplicate_event_joins_the_registered_run(bucket) -> None:
    db = boto3.client("dynamodb")
    create_runs_table(db, "runs")
    store = RunStore(db, "runs")
    record, created = store.register(_run())
    assert created
    again, created_again = store.register(_run().model_copy(update={"created_at": 5.0}))
    assert not created_again and again.created_at == 1.0
    updated = store.update("r-1", now=2.0, status="failed", error="stopped")
    assert (updated.status, updated.updated_at, store.get("r-1").error) == (
        "failed",
        2.0,
        "stopped",
    )

    with pytest.raises(KeyError):
        store.update("nope", now=1.0, status="failed")


def test_validation_streams_from_s3_and_reports_next_to_the_run(bucket) -> None:
    s3 = boto3.client("s3")
    version = s3.put_object(Bucket=BUCKET, Key="training-data/good.jsonl", Body=GOOD)["VersionId"]
    outcome = validate_upload(
        s3, bucket=BUCKET, key="training-data/good.jsonl", version_id=version, run_id="good-1"
    )
    assert outcome.valid and outcome.records == 2 and outcome.problems == 0
    report = json.loads(s3.get_object(Bucket=BUCKET, Key=outcome.report_key)["Body"].read())
    assert report["valid"] is True and report["version_id"] == version


def test_invalid_dataset_reports_line_numbers_and_creates_nothing_else(bucket) -> None:
    s3 = boto3.client("s3")
    body = GOOD + b"garbage\n" + b'{"id": "a", "metadata": {"prompt": "p"}}\n'
    s3.put_object(Bucket=BUCKET, Key="training-data/bad.jsonl", Body=body)
    outcome = validate_upload(
        s3, bucket=BUCKET, key="training-data/bad.jsonl", version_id=None, run_id="bad-1"
    )
    assert not outcome.valid and outcome.problems == 2
    assert outcome.first_problems == [
        "line 3: line: not valid JSON (expected value at column 1)",
        "line 4: id: duplicate of the id on line 1",
    ]
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET)["Contents"])
    assert keys == ["runs/bad-1/validation.json", "training-data/bad.jsonl"]
    assert not boto3.client("sqs").list_queues().get("QueueUrls")


def test_a_dataset_version_that_is_gone_is_an_error(bucket) -> None:
    with pytest.raises(ClientError):
        validate_upload(
            boto3.client("s3"),
            bucket=BUCKET,
            key="training-data/none.jsonl",
            version_id=None,
            run_id="x",
        )


def test_provision_then_teardown_leaves_nothing_and_can_repeat(bucket) -> None:
    role = boto3.client("iam").create_role(RoleName="consumer", AssumeRolePolicyDocument="{}")
    boto3.client("lambda").create_function(
        FunctionName="consumer", Runtime="python3.12", Role=role["Role"]["Arn"],
        Handler="lambdas.router.consumer.handler", Code={"ZipFile": b"code"},
    )  # fmt: skip
    wiring = RouterWiring(
        sqs=boto3.client("sqs"), cloudwatch=boto3.client("cloudwatch"),
        lambda_client=boto3.client("lambda"), consumer_function="consumer", prefix="nova-mtrl",
    )  # fmt: skip
    provisioned = provision_run(wiring, run_id="r-7", kms_key_id=None, alert_topic_arn=None)
    assert len(provisioned.queues) == 5 and len(provisioned.alarms) == 4
    assert provisioned.consumer_mapping
    # 5 queues, 4 alarms, 1 event source mapping
    assert leftover_resources(wiring, run_id="r-7") == 10
    assert teardown_run(wiring, run_id="r-7") == {"queues_deleted": 5, "leftover": 0}
    assert teardown_run(wiring, run_id="r-7") == {"queues_deleted": 0, "leftover": 0}
