"""A run's router resources: provision them, and tear every one of them down (idempotently).

A run's resources are its FIFO queues (and dead-letter queue), their age alarms, the event
source mapping that feeds its generate responses to the router's consumer, and, for a run whose
trainer is Nova's, the lease of the deployment's rollout Lambda (the `rollout_request_arn` its
jobs invoke: lambdas/router/rollout_forwarder.py), taken before anything else is made, so a run
that cannot have it creates nothing. The run's entry in the conversation table (with the token
its workers present) is written when the workers start.
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
from domain.run_state import TornDown
from lambdas.router.alarms import alarm_names, create_queue_alarms, delete_queue_alarms
from lambdas.router.conversations import ConversationStore
from lambdas.router.event_sources import (
    connect_consumer,
    consumer_mappings,
    disconnect_consumer,
)


@dataclass(frozen=True)
class RouterWiring:
    """Where the router lives: the SQS and CloudWatch clients, the consumer function, the
    rollout Lambda's ARN, the conversation store (runs' registrations, the rollout Lambda's
    lease)."""

    sqs: Any
    cloudwatch: Any
    lambda_client: Any
    consumer_function: str
    rollout_lambda_arn: str
    prefix: str
    conversations: ConversationStore


@dataclass(frozen=True)
class Provisioned:
    queues: dict[str, str]
    alarms: list[str]
    consumer_mapping: str
    rollout_request_arn: str | None


def provision_run(
    wiring: RouterWiring,
    *,
    run_id: str,
    kms_key_id: str | None,
    alert_topic_arn: str | None,
    nova_deadline: float | None,
    now: float,
) -> Provisioned:
    """Per-run queues, queue-age alarms, the consumer's event source mapping. A Nova run (its
    deadline given: its jobs invoke the rollout Lambda) first takes the rollout Lambda's lease
    (RolloutLambdaHeld while another run holds it)."""
    if nova_deadline is not None:
        wiring.conversations.hold_rollout_lambda(run_id, deadline_at=nova_deadline, now=now)
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
    return Provisioned(
        queues=queues.urls(),
        alarms=alarms,
        consumer_mapping=mapping,
        rollout_request_arn=wiring.rollout_lambda_arn if nova_deadline is not None else None,
    )


def teardown_run(wiring: RouterWiring, *, run_id: str) -> dict[str, int]:
    """Delete the run's registration with the router (its token is refused from now), release
    the rollout Lambda if it holds it, delete its mapping, queues and alarms; safe to repeat.
    Returns what was deleted and what is left (0 when teardown is complete)."""
    wiring.conversations.remove_run(run_id)
    wiring.conversations.release_rollout_lambda(run_id)
    disconnect_consumer(
        wiring.lambda_client,
        function=wiring.consumer_function,
        queue_name=queue_name(wiring.prefix, run_id, QueueKind.GENERATE_RESPONSES),
    )
    deleted = delete_run_queues(wiring.sqs, prefix=wiring.prefix, run_id=run_id)
    delete_queue_alarms(wiring.cloudwatch, prefix=wiring.prefix, run_id=run_id)
    return TornDown(
        run_id=run_id, queues_deleted=deleted, leftover=leftover_resources(wiring, run_id=run_id)
    )


def leftover_resources(wiring: RouterWiring, *, run_id: str) -> int:
    """How many of the run's queues, alarms, event source mappings, registrations and leases
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
    registered = wiring.conversations.get_run(run_id) is not None
    leased = wiring.conversations.rollout_lambda_holder() == run_id
    return queues + len(alarms) + mappings + registered + leased
