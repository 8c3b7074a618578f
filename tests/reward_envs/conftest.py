"""The reward worker's tests' run queues (moto's SQS)."""

from __future__ import annotations

from collections.abc import Iterator

import boto3
import pytest

from tests.aws import Serialized
from tests.reward_envs.test_worker import Queues


@pytest.fixture
def queues(aws: None) -> Iterator[Queues]:
    sqs = Serialized(boto3.client("sqs"))
    fifo = {"FifoQueue": "true"}
    urls = [
        sqs.create_queue(QueueName=f"run-{n}.fifo", Attributes=fifo)["QueueUrl"]
        for n in ("req", "resp", "dlq")
    ]
    yield Queues(sqs, *urls)
