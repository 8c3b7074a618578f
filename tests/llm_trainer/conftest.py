"""The open-weights trainer's tests run on the CPU with the tiny model (llm_trainer/tiny.py):
nothing is downloaded. `make test` installs the `llm` extra they need."""

from __future__ import annotations

from typing import Any

import boto3
import pytest

from domain.run_queues import QueueKind


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    from llm_trainer.tiny import tiny_tokenizer

    return tiny_tokenizer()


@pytest.fixture
def model(tokenizer: Any) -> Any:
    from llm_trainer.tiny import tiny_model

    return tiny_model(tokenizer, seed=0)


@pytest.fixture
def queues(aws: None) -> dict[str, str]:
    """The run's queues in moto's SQS (FIFO, messages visible again at once)."""
    sqs = boto3.client("sqs")
    return {
        kind.value: sqs.create_queue(
            QueueName=f"r-{kind.value.replace('_', '-')}.fifo",
            Attributes={"FifoQueue": "true", "VisibilityTimeout": "0"},
        )["QueueUrl"]
        for kind in QueueKind
    }
