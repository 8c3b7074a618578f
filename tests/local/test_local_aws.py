"""Embedded AWS for local mode: one request at a time, long polls that do not block others,
in-process clients, and SQS event source mappings polled as Lambda polls them."""

from __future__ import annotations

import json
import threading
import time

import boto3

from mtrl.local.aws import LocalAws


def test_a_long_poll_returns_when_a_message_arrives_and_blocks_no_one() -> None:
    with LocalAws() as aws:
        sqs = boto3.client("sqs")  # over HTTP, as the child processes talk to it
        url = sqs.create_queue(QueueName="q.fifo", Attributes={"FifoQueue": "true"})["QueueUrl"]
        received: list[tuple[float, int]] = []

        def receive() -> None:
            started = time.monotonic()
            answer = boto3.client("sqs").receive_message(QueueUrl=url, WaitTimeSeconds=10)
            received.append((time.monotonic() - started, len(answer.get("Messages", []))))

        waiting = threading.Thread(target=receive)
        waiting.start()
        deadline = time.monotonic() + 10
        while aws.app.requests < 3 and time.monotonic() < deadline:  # the receive is polling
            time.sleep(0.01)
        # Other requests are served while the receive waits ...
        assert sqs.list_queues()["QueueUrls"] == [url]
        aws.client("sqs").send_message(
            QueueUrl=url, MessageBody="m", MessageGroupId="g", MessageDeduplicationId="1"
        )
        waiting.join(timeout=10)
        # ... and the receive gets the message long before its 10 s are up.
        ((waited, count),) = received
        assert count == 1 and waited < 5


def test_in_process_clients_share_the_servers_state() -> None:
    with LocalAws() as aws:
        aws.client("s3").create_bucket(Bucket="local-bucket")
        aws.client("s3").put_object(Bucket="local-bucket", Key="k/with spaces.json", Body=b"{}")
        listed = boto3.client("s3").list_objects_v2(Bucket="local-bucket")["Contents"]
        assert [item["Key"] for item in listed] == ["k/with spaces.json"]
        body = (
            aws.client("s3")
            .get_object(Bucket="local-bucket", Key="k/with spaces.json")["Body"]
            .read()
        )
        assert body == b"{}"


def test_an_event_source_mapping_is_polled_until_it_is_deleted() -> None:
    with LocalAws() as aws:
        batches: list[list[str]] = []
        aws.dispatcher.add(
            "consumer",
            "lambdas.router.consumer.handler",
            lambda event: (
                batches.append([json.loads(r["body"])["n"] for r in event["Records"]])
                or {"batchItemFailures": []}
            ),
        )
        role = aws.client("iam").create_role(RoleName="r", AssumeRolePolicyDocument="{}")
        lambda_client, sqs = aws.client("lambda"), aws.client("sqs")
        lambda_client.create_function(
            FunctionName="consumer", Runtime="python3.12", Role=role["Role"]["Arn"],
            Handler="h.handler", Code={"ZipFile": b"x"},
        )  # fmt: skip
        url = sqs.create_queue(QueueName="responses")["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"][
            "QueueArn"
        ]
        mapping = lambda_client.create_event_source_mapping(
            EventSourceArn=arn, FunctionName="consumer", BatchSize=10
        )["UUID"]
        for n in range(3):
            sqs.send_message(QueueUrl=url, MessageBody=json.dumps({"n": n}))
        deadline = time.monotonic() + 10
        while sum(len(b) for b in batches) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sorted(n for batch in batches for n in batch) == [0, 1, 2]
        assert "Messages" not in sqs.receive_message(QueueUrl=url)  # handled ones are deleted
        assert aws.mappings.active == 1
        lambda_client.delete_event_source_mapping(UUID=mapping)
        deadline = time.monotonic() + 10
        while aws.mappings.active and time.monotonic() < deadline:
            time.sleep(0.05)
        assert aws.mappings.active == 0
