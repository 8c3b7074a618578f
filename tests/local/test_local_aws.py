"""Embedded AWS for local mode: one request at a time, long polls that do not block others,
in-process clients, and SQS event source mappings polled as Lambda polls them."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

import boto3
import pytest

from lambdas.router.conversations import create_table
from mtrl.local.aws import (
    _RETRY_SHORT_POLL_SECONDS,
    LocalAws,
    MotoServer,
    _queue_name,
    local_credentials,
)
from mtrl.local.embedded import function_session
from mtrl.local.physical import REGION


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


def test_a_waiting_receive_is_woken_by_its_own_queue_only() -> None:
    """Sends to other queues do not make it poll again (each poll is a request on the server's
    one lock): it polls at its start, on the fallback ticks, and at its end."""
    with LocalAws() as aws:
        sqs = aws.client("sqs")
        quiet = sqs.create_queue(QueueName="quiet")["QueueUrl"]
        busy = sqs.create_queue(QueueName="busy")["QueueUrl"]
        before = aws.app.requests
        waiting = threading.Thread(
            target=lambda: boto3.client("sqs").receive_message(QueueUrl=quiet, WaitTimeSeconds=2)
        )
        waiting.start()
        for index in range(40):
            sqs.send_message(QueueUrl=busy, MessageBody=f"m{index}")
        waiting.join(timeout=10)
        polls = aws.app.requests - before - 40
        assert 1 <= polls <= 2 / _RETRY_SHORT_POLL_SECONDS + 2


def test_deleting_a_queue_ends_the_receives_waiting_on_it(monkeypatch) -> None:
    """A torn-down run's event source pollers end with their queues, not a fallback tick later
    (the run counts pollers left behind)."""
    monkeypatch.setattr("mtrl.local.aws._RETRY_SHORT_POLL_SECONDS", 30.0)
    with LocalAws() as aws:
        sqs = aws.client("sqs")
        url = sqs.create_queue(QueueName="run-queue")["QueueUrl"]
        errors: list[str] = []

        def receive() -> None:
            try:
                boto3.client("sqs").receive_message(QueueUrl=url, WaitTimeSeconds=20)
            except sqs.exceptions.QueueDoesNotExist as error:
                errors.append(error.response["Error"]["Code"])

        waiting = threading.Thread(target=receive)
        waiting.start()
        deadline = time.monotonic() + 10
        while aws.app.requests < 2 and time.monotonic() < deadline:  # the receive is waiting
            time.sleep(0.01)
        sqs.delete_queue(QueueUrl=url)
        waiting.join(timeout=10)
        assert not waiting.is_alive() and len(errors) == 1


def test_the_queue_a_request_names_is_read_from_its_body() -> None:
    body = json.dumps({"QueueUrl": "http://127.0.0.1:5000/123456789012/run-7-rollout.fifo"})
    assert _queue_name(body.encode()) == "run-7-rollout.fifo"
    assert _queue_name(b"{}") == "" and _queue_name(b"not json") == ""


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


def test_dynamodb_handed_straight_to_moto_answers_as_the_server_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in local_credentials().items():
        monkeypatch.setenv(name, value)
    with MotoServer() as server:
        direct = server.client("dynamodb")  # moto's handler, no WSGI
        over_http = boto3.client("dynamodb", endpoint_url=server.endpoint, region_name=REGION)
        create_table(direct, "conversations")
        key = {"run_id": {"S": "run-1"}, "item": {"S": "run"}}
        over_http.put_item(TableName="conversations", Item={**key, "n": {"N": "1"}})
        direct.update_item(
            TableName="conversations", Key=key, UpdateExpression="SET n = n + :one",
            ConditionExpression="attribute_exists(run_id)",
            ExpressionAttributeValues={":one": {"N": "1"}},
        )  # fmt: skip
        assert over_http.get_item(TableName="conversations", Key=key)["Item"]["n"] == {"N": "2"}
        assert direct.list_tables()["TableNames"] == over_http.list_tables()["TableNames"]
        # Its errors are the service's, as botocore models them.
        with pytest.raises(direct.exceptions.ConditionalCheckFailedException):
            direct.put_item(
                TableName="conversations", Item=key,
                ConditionExpression="attribute_not_exists(run_id)",
            )  # fmt: skip
        with pytest.raises(direct.exceptions.ResourceNotFoundException):
            direct.get_item(TableName="elsewhere", Key=key)
        before = server.app.requests
        direct.list_tables()
        assert server.app.requests == before + 1  # served one at a time with the server's own


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


@contextmanager
def _raw_put(aws: LocalAws, headers: bytes) -> Iterator[socket.socket]:
    """A raw HTTP PUT of s3://bucket-one/key, its headers sent; the caller sends the body and
    the PUT must then succeed."""
    aws.client("s3").create_bucket(Bucket="bucket-one")
    url = urlsplit(aws.endpoint)
    with socket.create_connection((url.hostname, url.port), timeout=10) as connection:
        connection.sendall(b"PUT /bucket-one/key HTTP/1.1\r\nHost: 127.0.0.1\r\n" + headers)
        yield connection
        assert b" 200 OK" in connection.recv(4096)


def _stored(aws: LocalAws) -> bytes:
    return aws.client("s3").get_object(Bucket="bucket-one", Key="key")["Body"].read()


def test_a_client_expecting_100_continue_is_told_to_go_on_before_it_sends_its_body() -> None:
    """botocore sends `Expect: 100-continue` with every S3 PUT and holds the body back until
    told to go on (or a second has passed): the server must answer at once."""
    with LocalAws() as aws:
        with _raw_put(aws, b"Content-Length: 5\r\nExpect: 100-continue\r\n\r\n") as connection:
            assert connection.recv(64).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
            connection.sendall(b"hello")
        assert _stored(aws) == b"hello"


def test_a_chunked_body_arrives_whole() -> None:
    with LocalAws() as aws:
        with _raw_put(aws, b"Transfer-Encoding: chunked\r\n\r\n") as connection:
            connection.sendall(b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")
        assert _stored(aws) == b"hello world"


def test_while_lambdas_run_in_process_default_session_clients_are_made_one_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """moto's Step Functions interpreter makes a client per task from boto3's default session
    while pollers make theirs in other threads; making them is not thread-safe, so each is
    made holding the lock — and boto3 is as it was afterwards."""
    from mtrl.local import embedded

    held: list[bool] = []

    def making(*args: object, **kwargs: object) -> str:
        held.append(embedded._DEFAULT_SESSION_LOCK.locked())
        return f"client of {args[0]}"

    monkeypatch.setattr(boto3, "client", making)
    with embedded.in_process_lambdas():
        assert boto3.client("lambda", region_name="us-east-1") == "client of lambda"
        threads = [threading.Thread(target=boto3.client, args=("sqs",)) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=10)
    assert held == [True] * 5
    assert boto3.client is making


def test_while_lambdas_run_in_process_a_stopped_execution_is_not_failed_afterwards() -> None:
    """On AWS a stopped execution stays ABORTED; moto's interpreter would record a failure of
    the state still in flight at the stop (it cannot set a stopped program's next state)."""
    import datetime
    import types

    from moto.stepfunctions.parser.asl.eval.environment import Environment
    from moto.stepfunctions.parser.asl.eval.program_state import (
        ProgramError,
        ProgramRunning,
        ProgramStopped,
    )

    from mtrl.local import embedded

    def program(state: object) -> types.SimpleNamespace:
        return types.SimpleNamespace(
            _state_mutex=threading.RLock(), _program_state=state, _frames=[],
            program_state_event=threading.Event(),
        )  # fmt: skip

    stopped = program(ProgramStopped(stop_date=datetime.datetime.now(), error="x", cause="y"))
    running = program(ProgramRunning())
    failure = {"error": "States.Runtime", "cause": "RuntimeError(Could not set NextState)"}
    with embedded.in_process_lambdas():
        Environment.set_error(stopped, failure)
        Environment.set_error(running, failure)
    assert isinstance(stopped._program_state, ProgramStopped)
    assert isinstance(running._program_state, ProgramError)  # a running one still fails
    assert Environment.set_error is embedded._ORIGINAL_SET_ERROR  # moto as it was afterwards


def test_function_sessions_read_botocores_data_once_and_sign_as_their_own_principal() -> None:
    """Each local function's session (one per function, as each Lambda function has its own
    process on AWS) shares botocore's loaded models with the others: a second principal's
    client is built on the very model the first read, yet signs with its own credentials."""
    first = function_session(aws_access_key_id="AKIAFIRST", aws_secret_access_key="one")
    second = function_session(aws_access_key_id="AKIASECOND", aws_secret_access_key="two")
    one, two = first.client("sagemaker"), second.client("sagemaker")
    read = one.meta.service_model._service_description
    # Each client has a model of its own, made of the data read once.
    assert one.meta.service_model is not two.meta.service_model
    assert two.meta.service_model._service_description is read
    assert (first.get_credentials().access_key, second.get_credentials().access_key) == (
        "AKIAFIRST", "AKIASECOND",
    )  # fmt: skip
    assert one.meta.region_name == two.meta.region_name == REGION
    # boto3 adds its data folder to each session's loader: the shared one keeps it once.
    paths = first._loader.search_paths
    assert len(paths) == len(set(paths))
    unshared = boto3.Session(region_name=REGION).client("sagemaker")
    assert unshared.meta.service_model._service_description is not read
