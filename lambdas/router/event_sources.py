"""A run's `generate-responses` queue wired to the router's consumer function.

The consumer (lambdas/router/consumer.py) reads generate responses through a Lambda event
source mapping per run, created with the run's queues and deleted with them. Both directions
are idempotent: a mapping that exists is reused, one that is gone is not an error.
"""

from __future__ import annotations

import contextlib
from typing import Any

BATCH_SIZE = 10


def _mappings(lambda_client: Any, *, function: str, queue_name: str) -> list[dict[str, Any]]:
    pages = lambda_client.get_paginator("list_event_source_mappings").paginate(
        FunctionName=function
    )
    return [
        mapping
        for page in pages
        for mapping in page["EventSourceMappings"]
        if mapping["EventSourceArn"].rsplit(":", 1)[-1] == queue_name
    ]


def connect_consumer(lambda_client: Any, *, function: str, queue_arn: str) -> str:
    """The mapping from the queue to the consumer (created once); returns its UUID."""
    existing = _mappings(lambda_client, function=function, queue_name=queue_arn.rsplit(":", 1)[-1])
    if existing:
        return existing[0]["UUID"]
    return lambda_client.create_event_source_mapping(
        EventSourceArn=queue_arn,
        FunctionName=function,
        BatchSize=BATCH_SIZE,
        # Malformed or unknown responses go back to the queue (and on to its DLQ) one by one.
        FunctionResponseTypes=["ReportBatchItemFailures"],
        Enabled=True,
    )["UUID"]


def disconnect_consumer(lambda_client: Any, *, function: str, queue_name: str) -> int:
    """Delete the queue's mappings to the consumer; returns how many there were."""
    found = _mappings(lambda_client, function=function, queue_name=queue_name)
    for mapping in found:
        with contextlib.suppress(lambda_client.exceptions.ResourceNotFoundException):
            lambda_client.delete_event_source_mapping(UUID=mapping["UUID"])
    return len(found)


def consumer_mappings(lambda_client: Any, *, function: str, queue_name: str) -> int:
    return len(_mappings(lambda_client, function=function, queue_name=queue_name))
