"""A run's router resources: provision them, and tear every one of them down (idempotently)."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from lambdas.router.alarms import alarm_names, create_queue_alarms, delete_queue_alarms
from lambdas.router.conversations import ConversationStore
from lambdas.router.run_queues import (
    DLQ,
    KINDS,
    create_run_queues,
    delete_run_queues,
    queue_base,
    queue_name,
)


@dataclass(frozen=True)
class Provisioned:
    queues: dict[str, str]
    alarms: list[str]
    run_token: str


def provision_run(
    *,
    sqs: Any,
    cloudwatch: Any,
    conversations: ConversationStore,
    prefix: str,
    run_id: str,
    kms_key_id: str | None,
    alert_topic_arn: str | None,
    now: float,
) -> Provisioned:
    """Per-run queues, queue-age alarms and the run's entry in the conversation table."""
    queues = create_run_queues(sqs, prefix=prefix, run_id=run_id, kms_key_id=kms_key_id)
    alarms = create_queue_alarms(
        cloudwatch, prefix=prefix, run_id=run_id, topic_arn=alert_topic_arn
    )
    token = secrets.token_urlsafe(32)
    conversations.put_run(run_id, token=token, queues=queues.urls(), now=now)
    return Provisioned(queues=queues.urls(), alarms=alarms, run_token=token)


def teardown_run(*, sqs: Any, cloudwatch: Any, prefix: str, run_id: str) -> dict[str, int]:
    """Delete the run's queues and alarms; safe to repeat. Returns what was deleted and what is
    left (0 when teardown is complete)."""
    deleted = delete_run_queues(sqs, prefix=prefix, run_id=run_id)
    delete_queue_alarms(cloudwatch, prefix=prefix, run_id=run_id)
    return {
        "queues_deleted": deleted,
        "leftover": leftover_resources(
            sqs=sqs, cloudwatch=cloudwatch, prefix=prefix, run_id=run_id
        ),
    }


def leftover_resources(*, sqs: Any, cloudwatch: Any, prefix: str, run_id: str) -> int:
    """How many of the run's queues and alarms still exist."""
    names = {queue_name(prefix, run_id, kind) for kind in (*KINDS, DLQ)}
    listed = sqs.list_queues(QueueNamePrefix=queue_base(prefix, run_id)).get("QueueUrls", [])
    queues = sum(1 for url in listed if url.rsplit("/", 1)[-1] in names)
    alarms = cloudwatch.describe_alarms(AlarmNames=alarm_names(prefix, run_id))["MetricAlarms"]
    return queues + len(alarms)
