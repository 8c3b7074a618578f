"""A run's router resources: provision them, and tear every one of them down (idempotently).

A run's resources are its FIFO queues (and dead-letter queue), their age alarms, the event
source mapping that feeds its generate responses to the router's consumer, and its aliases of
the rollout forwarder (the `rollout_request_arn` a Nova trainer invokes: training's, and one
per evaluation). The run's entry in the conversation table (with the token its workers present)
is written when the workers start.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from domain.run_queues import (
    QueueKind,
    create_run_queues,
    delete_run_queues,
    queue_base,
    queue_name,
)
from lambdas.router.alarms import alarm_names, create_queue_alarms, delete_queue_alarms
from lambdas.router.conversations import ConversationStore
from lambdas.router.event_sources import (
    connect_consumer,
    consumer_mappings,
    disconnect_consumer,
)
from lambdas.router.rollout_aliases import (
    create_rollout_aliases,
    delete_rollout_aliases,
    rollout_aliases_left,
)


@dataclass(frozen=True)
class RouterWiring:
    """Where the router lives: the SQS and CloudWatch clients, the consumer and the rollout
    forwarder functions, the conversation store (runs' registrations)."""

    sqs: Any
    cloudwatch: Any
    lambda_client: Any
    consumer_function: str
    rollout_forwarder: str
    prefix: str
    conversations: ConversationStore


@dataclass(frozen=True)
class Provisioned:
    queues: dict[str, str]
    alarms: list[str]
    consumer_mapping: str
    rollout_request_arn: str


def provision_run(
    wiring: RouterWiring, *, run_id: str, kms_key_id: str | None, alert_topic_arn: str | None
) -> Provisioned:
    """Per-run queues, queue-age alarms, the consumer's event source mapping and the rollout
    forwarder's aliases."""
    queues = create_run_queues(
        wiring.sqs, prefix=wiring.prefix, run_id=run_id, kms_key_id=kms_key_id
    )
    alarms = create_queue_alarms(
        wiring.cloudwatch, prefix=wiring.prefix, run_id=run_id, topic_arn=alert_topic_arn
    )
    responses_arn = wiring.sqs.get_queue_attributes(
        QueueUrl=queues.generate_responses, AttributeNames=["QueueArn"]
    )["Attributes"]["QueueArn"]
    mapping = connect_consumer(
        wiring.lambda_client, function=wiring.consumer_function, queue_arn=responses_arn
    )
    alias = create_rollout_aliases(
        wiring.lambda_client, function=wiring.rollout_forwarder, run_id=run_id
    )
    return Provisioned(
        queues=queues.urls(), alarms=alarms, consumer_mapping=mapping, rollout_request_arn=alias
    )


def teardown_run(wiring: RouterWiring, *, run_id: str) -> dict[str, int]:
    """Delete the run's registration with the router (its token is refused from now), aliases,
    mapping, queues and alarms; safe to repeat. Returns what was deleted and what is left (0 when
    teardown is complete)."""
    wiring.conversations.remove_run(run_id)
    delete_rollout_aliases(wiring.lambda_client, function=wiring.rollout_forwarder, run_id=run_id)
    disconnect_consumer(
        wiring.lambda_client,
        function=wiring.consumer_function,
        queue_name=queue_name(wiring.prefix, run_id, QueueKind.GENERATE_RESPONSES),
    )
    deleted = delete_run_queues(wiring.sqs, prefix=wiring.prefix, run_id=run_id)
    delete_queue_alarms(wiring.cloudwatch, prefix=wiring.prefix, run_id=run_id)
    return {"queues_deleted": deleted, "leftover": leftover_resources(wiring, run_id=run_id)}


def leftover_resources(wiring: RouterWiring, *, run_id: str) -> int:
    """How many of the run's queues, alarms, event source mappings, aliases and registrations
    still exist."""
    names = {queue_name(wiring.prefix, run_id, kind) for kind in QueueKind}
    listed = wiring.sqs.list_queues(QueueNamePrefix=queue_base(wiring.prefix, run_id)).get(
        "QueueUrls", []
    )
    queues = sum(1 for url in listed if url.rpartition("/")[2] in names)
    alarms = wiring.cloudwatch.describe_alarms(AlarmNames=alarm_names(wiring.prefix, run_id))[
        "MetricAlarms"
    ]
    mappings = consumer_mappings(
        wiring.lambda_client,
        function=wiring.consumer_function,
        queue_name=queue_name(wiring.prefix, run_id, QueueKind.GENERATE_RESPONSES),
    )
    aliases = rollout_aliases_left(
        wiring.lambda_client, function=wiring.rollout_forwarder, run_id=run_id
    )
    registered = wiring.conversations.get_run(run_id) is not None
    return queues + len(alarms) + mappings + aliases + registered
