"""Pipeline steps under moto: streaming validation from S3, provisioning and idempotent
teardown of a run's router resources."""

from __future__ import annotations

import json
from dataclasses import replace

import boto3
import pytest
from botocore.exceptions import ClientError

from domain.run_state import TornDown
from lambdas.pipeline.resources import (
    RouterWiring,
    leftover_resources,
    provision_run,
    teardown_run,
)
from lambdas.pipeline.validate import validate_upload
from lambdas.router.conversations import ConversationStore, RolloutLambdaHeld, create_table
from tests.aws import create_router_functions

BUCKET = "data-bucket"
GOOD = b'{"id": "a", "metadata": {"prompt": "p", "answer": "crane"}}\n{"id": "b", "metadata": {"prompt": "p"}}\n'


@pytest.fixture
def bucket(aws: None) -> None:
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket=BUCKET)
    s3.put_bucket_versioning(Bucket=BUCKET, VersioningConfiguration={"Status": "Enabled"})


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
        "line 3: not valid JSON (expected value at column 1)",
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


def _wiring() -> RouterWiring:
    consumer, forwarder = create_router_functions(boto3.client("lambda"), boto3.client("iam"))
    create_table(boto3.client("dynamodb"), "conversations")
    return RouterWiring(
        sqs=boto3.client("sqs"), cloudwatch=boto3.client("cloudwatch"),
        lambda_client=boto3.client("lambda"), consumer_function=consumer,
        rollout_lambda_arn=forwarder, prefix="nova-mtrl",
        conversations=ConversationStore(boto3.client("dynamodb"), "conversations"),
    )  # fmt: skip


NOVA = {"nova_deadline": 7_200.0, "now": 0.0}  # a Nova run's: its deadline
OTHER_TRAINER = {"nova_deadline": None, "now": 0.0}


def test_provision_then_teardown_leaves_nothing_and_can_repeat(bucket) -> None:
    wiring = _wiring()
    key = boto3.client("kms").create_key()["KeyMetadata"]["KeyId"]
    topic = boto3.client("sns").create_topic(Name="alerts")["TopicArn"]
    made = {"kms_key_id": key, "alert_topic_arn": topic, **NOVA}
    provisioned = provision_run(wiring, run_id="r-7", **made)
    assert len(provisioned.queues) == 5 and len(provisioned.alarms) == 4
    assert provisioned.consumer_mapping
    for url in provisioned.queues.values():  # encrypted with the deployment's key
        attributes = wiring.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])
        assert attributes["Attributes"]["KmsMasterKeyId"] == key
    alarms = wiring.cloudwatch.describe_alarms(AlarmNames=provisioned.alarms)["MetricAlarms"]
    assert [alarm["AlarmActions"] for alarm in alarms] == [[topic]] * 4
    # The forwarder itself, unqualified, as the Forge SDK passes its stack's; the run holds it.
    function = wiring.lambda_client.get_function(FunctionName="rollout-forwarder")
    assert provisioned.rollout_request_arn == function["Configuration"]["FunctionArn"]
    assert provisioned.rollout_request_arn.endswith(":function:rollout-forwarder")
    assert wiring.conversations.rollout_lambda_holder(now=0.0) == "r-7"
    # Provisioning again (a retried step) changes nothing and answers the same.
    assert provision_run(wiring, run_id="r-7", **made) == provisioned
    # 5 queues, 4 alarms, 1 event source mapping, the rollout Lambda's lease
    assert leftover_resources(wiring, run_id="r-7") == 11
    assert teardown_run(wiring, run_id="r-7") == TornDown(
        run_id="r-7", queues_deleted=5, leftover=0
    )
    assert wiring.conversations.rollout_lambda_holder() is None
    assert teardown_run(wiring, run_id="r-7") == TornDown(
        run_id="r-7", queues_deleted=0, leftover=0
    )


def test_a_run_of_another_trainer_leaves_the_rollout_lambda_alone(bucket) -> None:
    wiring = _wiring()
    provision_run(wiring, run_id="nova-1", kms_key_id=None, alert_topic_arn=None, **NOVA)
    mine = provision_run(
        wiring, run_id="r-1", kms_key_id=None, alert_topic_arn=None, **OTHER_TRAINER
    )
    assert mine.rollout_request_arn is None
    assert teardown_run(wiring, run_id="r-1") == TornDown(
        run_id="r-1", queues_deleted=5, leftover=0
    )
    assert wiring.conversations.rollout_lambda_holder(now=0.0) == "nova-1"


def test_a_second_nova_run_creates_nothing_while_the_first_holds_the_rollout_lambda(
    bucket,
) -> None:
    """Refused before any queue, alarm or mapping exists; its teardown (the failure path) leaves
    the first run's lease in place."""
    wiring = _wiring()
    provision_run(wiring, run_id="nova-1", kms_key_id=None, alert_topic_arn=None, **NOVA)
    with pytest.raises(
        RolloutLambdaHeld, match="^run nova-2: the deployment's rollout Lambda serves run nova-1's"
    ):
        provision_run(wiring, run_id="nova-2", kms_key_id=None, alert_topic_arn=None, **NOVA)
    assert leftover_resources(wiring, run_id="nova-2") == 0
    assert teardown_run(wiring, run_id="nova-2") == TornDown(
        run_id="nova-2", queues_deleted=0, leftover=0
    )
    assert wiring.conversations.rollout_lambda_holder(now=0.0) == "nova-1"
    teardown_run(wiring, run_id="nova-1")
    assert provision_run(wiring, run_id="nova-2", kms_key_id=None, alert_topic_arn=None, **NOVA)


def test_teardown_counts_what_it_could_not_delete(bucket) -> None:
    """A teardown whose deletes do not take (here: alarms) says what is left, so the run's
    notice and `mtrl status` show it instead of a clean 0."""
    wiring = _wiring()
    provision_run(wiring, run_id="r-8", kms_key_id=None, alert_topic_arn=None, **NOVA)
    stuck = replace(wiring, cloudwatch=IgnoresDeletes(wiring.cloudwatch))
    assert teardown_run(stuck, run_id="r-8") == TornDown(run_id="r-8", queues_deleted=5, leftover=4)


class IgnoresDeletes:
    """CloudWatch that answers DeleteAlarms as if it worked, and deletes nothing."""

    def __init__(self, client: object) -> None:
        self._client = client

    def delete_alarms(self, **_: object) -> dict:
        return {}

    def __getattr__(self, name: str) -> object:
        return getattr(self._client, name)


def test_after_teardown_nothing_speaks_for_the_run(bucket) -> None:
    """Teardown deletes the run's registration: its token is refused at once (a warm proxy's
    cache at most RUN_CACHE_SECONDS later), the consumer no longer finds the run of its queues;
    the turns and reports stay, the run's record of what happened."""
    wiring = _wiring()
    provisioned = provision_run(
        wiring, run_id="r-9", kms_key_id=None, alert_topic_arn=None, **OTHER_TRAINER
    )
    store = wiring.conversations
    store.put_run("r-9", token="t", queues=provisioned.queues, model="m", now=0.0)
    store.start_step("r-9", "s_0_1", sample_id="s_0", now=0.0)
    queue = provisioned.queues["generate_responses"]
    assert store.run_of_queue(queue) == "r-9"
    assert leftover_resources(wiring, run_id="r-9") == 11  # the registration among them
    assert teardown_run(wiring, run_id="r-9") == TornDown(
        run_id="r-9", queues_deleted=5, leftover=0
    )
    assert store.get_run("r-9") is None and store.run_of_queue(queue) is None
    assert store.get_step("r-9", "s_0_1") is not None
    assert teardown_run(wiring, run_id="r-9") == TornDown(
        run_id="r-9", queues_deleted=0, leftover=0
    )
