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


@pytest.fixture(scope="session")
def openenv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Real OpenEnv servers (tests/reward_envs/openenv_servers.py): each kind's base URL."""
    from tests.reward_envs.openenv_servers import openenv_servers

    with openenv_servers(tmp_path_factory.mktemp("openenv")) as urls:
        yield dict(urls)
