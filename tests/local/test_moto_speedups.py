"""moto's memoized lookups and lazily worked-out queue attributes (mtrl/local/moto_speedups.py)
answer exactly as the originals; the collector's tuning for a run (mtrl/local/aws.py) is undone
after it."""

from __future__ import annotations

import gc
import json
from datetime import datetime

import boto3
import moto.core.responses
import moto.core.utils
import moto.sqs.models
from moto import mock_aws
from moto.sqs.models import Queue, sqs_backends
from moto.sqs.responses import SQSResponse

from mtrl.local import moto_speedups
from mtrl.local.aws import GC_THRESHOLDS, collector_tuned_for_serving
from mtrl.local.physical import ACCOUNT, REGION


def test_the_cached_lookups_answer_as_the_originals() -> None:
    moto_speedups.install()
    moto_speedups.install()  # a second install changes nothing
    cached = moto.core.utils.camelcase_to_underscores
    names = [*Queue.BASE_ATTRIBUTES, *Queue.FIFO_ATTRIBUTES, "ReceiveMessage", "QueueArn", ""]
    assert [cached(name) for name in names] == [cached.__wrapped__(name) for name in names]
    assert cached("MessageRetentionPeriod") == "message_retention_period"
    # A module that imported the name before install uses the cached one too.
    assert moto.sqs.models.camelcase_to_underscores is cached
    assert moto.core.responses.camelcase_to_underscores is cached
    assert moto.core.responses.method_names_from_class(SQSResponse) == (
        moto.core.utils.method_names_from_class(SQSResponse)
    )


def test_the_cached_epoch_answers_as_the_original() -> None:
    moto_speedups.install()
    cached = moto.core.utils.utcfromtimestamp
    stamps = [0, 1, 1_700_000_000, 1_700_000_000.123456, -86_400]
    assert [cached(stamp) for stamp in stamps] == [cached.__wrapped__(stamp) for stamp in stamps]
    assert cached(0) == datetime(1970, 1, 1) and cached(0).tzinfo is None
    # unix_time reads it from moto.core.utils at each call: the same figures as before.
    moment = datetime(2026, 12, 7, 12, 30, 15, 250_000)
    assert moto.core.utils.unix_time(moment) == (moment - datetime(1970, 1, 1)).total_seconds()
    assert moto.core.utils.unix_time_millis(moment) == 1_796_646_615_250.0


def test_a_queues_attributes_are_moto_s_own_names_order_and_values() -> None:
    moto_speedups.install()
    with mock_aws():
        sqs = boto3.client("sqs", region_name=REGION)
        dead = sqs.create_queue(QueueName="dead")["QueueUrl"]
        dead_arn = sqs.get_queue_attributes(QueueUrl=dead, AttributeNames=["QueueArn"])
        redrive = {"deadLetterTargetArn": dead_arn["Attributes"]["QueueArn"], "maxReceiveCount": 3}
        plain = sqs.create_queue(
            QueueName="plain",
            Attributes={
                "RedrivePolicy": json.dumps(redrive), "DelaySeconds": "0",
                "Policy": json.dumps({"Version": "2012-10-17", "Statement": []}),
            },
        )["QueueUrl"]  # fmt: skip
        fifo = sqs.create_queue(
            QueueName="run.fifo",
            Attributes={"FifoQueue": "true", "ContentBasedDeduplication": "true"},
        )["QueueUrl"]
        sqs.create_queue(QueueName="sealed", Attributes={"KmsMasterKeyId": "alias/run"})
        # Messages in every state the counts tell apart: visible, delayed, in flight.
        for n in range(3):
            sqs.send_message(QueueUrl=plain, MessageBody=str(n))
            sqs.send_message(QueueUrl=fifo, MessageBody=str(n), MessageGroupId=f"g{n}")
        sqs.send_message(QueueUrl=plain, MessageBody="later", DelaySeconds=60)
        sqs.receive_message(QueueUrl=plain, MaxNumberOfMessages=1, VisibilityTimeout=60)
        sqs.receive_message(QueueUrl=fifo, MaxNumberOfMessages=1, VisibilityTimeout=60)

        queues = sqs_backends[ACCOUNT][REGION].queues
        assert set(queues) == {"dead", "plain", "run.fifo", "sealed"}
        for queue in queues.values():
            original = moto_speedups.ORIGINAL_QUEUE_ATTRIBUTES(queue)
            lazy = queue.attributes
            assert isinstance(lazy, moto_speedups.QueueAttributes)
            assert list(lazy) == list(original) and dict(lazy) == original, queue.name
            assert "Missing" not in lazy and lazy.get("Missing") is None
        counted = queues["plain"].attributes
        assert [counted[f"ApproximateNumberOfMessages{kind}"] for kind in ("", "Delayed", "NotVisible")] == [2, 1, 1]  # fmt: skip
        assert queues["run.fifo"].attributes["ContentBasedDeduplication"] == "true"
        assert json.loads(counted["RedrivePolicy"]) == redrive
        # Through the API, as a client reads them.
        read = sqs.get_queue_attributes(QueueUrl=plain, AttributeNames=["All"])["Attributes"]
        assert read == {k: str(v) for k, v in moto_speedups.ORIGINAL_QUEUE_ATTRIBUTES(queues["plain"]).items() if v is not None}  # fmt: skip


def test_the_collector_is_tuned_for_a_run_and_restored_after_it() -> None:
    before = gc.get_threshold()
    with collector_tuned_for_serving():
        assert gc.get_threshold() == GC_THRESHOLDS
        assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
