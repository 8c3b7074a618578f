"""The four FIFO queues of a run (and their shared dead-letter queue): create and delete.

Both are idempotent: creating again with the same attributes returns the same URLs, deleting
queues that are gone is not an error. Names derive from the run id and stay within SQS's
80-character limit.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

from botocore.exceptions import ClientError

from domain.naming import run_resource_name


class QueueKind(StrEnum):
    """A run's queue: the value keys the run's queue URLs (in the state, the job, `RunQueues`);
    the queue's name ends with `suffix`. Iterating the enum gives all five."""

    ROLLOUT_REQUESTS = "rollout_requests"
    ROLLOUT_RESPONSES = "rollout_responses"
    GENERATE_REQUESTS = "generate_requests"
    GENERATE_RESPONSES = "generate_responses"
    DLQ = "dlq"

    @property
    def suffix(self) -> str:
        return self.value.replace("_", "-")


# The four that carry messages (the dead-letter queue takes what they cannot deliver).
KINDS = tuple(kind for kind in QueueKind if kind is not QueueKind.DLQ)
_SQS_NAME_LIMIT = 80
_LONGEST_SUFFIX = max(len(kind.suffix) for kind in QueueKind) + len("-") + len(".fifo")
MAX_RECEIVE_COUNT = 5
RETENTION_SECONDS = 4 * 24 * 3600
VISIBILITY_TIMEOUT_SECONDS = 120
# "The message deletion process takes up to 60 seconds. We recommend waiting for 60 seconds
# regardless of your queue's size." (SQS API Reference, PurgeQueue; botocore's SQS model.)
PURGE_SECONDS = 60
_PURGING = ("PurgeQueueInProgress", "AWS.SimpleQueueService.PurgeQueueInProgress")


@dataclass(frozen=True)
class RunQueues:
    rollout_requests: str
    rollout_responses: str
    generate_requests: str
    generate_responses: str
    dlq: str

    def urls(self) -> dict[str, str]:
        return asdict(self)


def queue_base(prefix: str, run_id: str) -> str:
    """`<prefix>-run-<run id>` (domain/naming.py), shortened with a hash when needed so every
    queue name fits SQS."""
    base = run_resource_name(prefix, run_id)
    limit = _SQS_NAME_LIMIT - _LONGEST_SUFFIX
    if len(base) <= limit:
        return base
    digest = hashlib.sha256(base.encode()).hexdigest()[:10]
    return f"{base[: limit - 11]}-{digest}"


def queue_name(prefix: str, run_id: str, kind: QueueKind) -> str:
    return f"{queue_base(prefix, run_id)}-{kind.suffix}.fifo"


def create_run_queues(
    sqs: Any, *, prefix: str, run_id: str, kms_key_id: str | None = None
) -> RunQueues:
    encryption = {"KmsMasterKeyId": kms_key_id} if kms_key_id else {"SqsManagedSseEnabled": "true"}
    common = {
        "FifoQueue": "true",
        "ContentBasedDeduplication": "false",
        "MessageRetentionPeriod": str(RETENTION_SECONDS),
        **encryption,
    }
    tags = {"nova-mtrl:run": run_id[:256]}
    dlq_url = _create(sqs, queue_name(prefix, run_id, QueueKind.DLQ), common, tags)
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    redrive = json.dumps(
        {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": MAX_RECEIVE_COUNT}, sort_keys=True
    )
    attributes = {
        **common,
        "VisibilityTimeout": str(VISIBILITY_TIMEOUT_SECONDS),
        "RedrivePolicy": redrive,
    }
    urls = {
        kind: _create(sqs, queue_name(prefix, run_id, kind), attributes, tags) for kind in KINDS
    }
    return RunQueues(**{kind.value: url for kind, url in urls.items()}, dlq=dlq_url)


def delete_run_queues(sqs: Any, *, prefix: str, run_id: str) -> int:
    """Delete every queue of the run that still exists; returns how many were deleted."""
    deleted = 0
    for kind in QueueKind:
        try:
            url = sqs.get_queue_url(QueueName=queue_name(prefix, run_id, kind))["QueueUrl"]
            sqs.delete_queue(QueueUrl=url)
            deleted += 1
        except ClientError as error:
            if not _is_missing(error):
                raise
    return deleted


def purge_run_queues(sqs: Any, queues: dict[str, str]) -> int:
    """Delete every message on the run's message-carrying queues (the dead-letter queue keeps
    what it holds, for inspection); returns how many queues were purged. A queue purged in the
    last minute is left to that purge (SQS refuses a second with PurgeQueueInProgress)."""
    purged = 0
    for kind in KINDS:
        try:
            sqs.purge_queue(QueueUrl=queues[kind])
            purged += 1
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") not in _PURGING:
                raise
    return purged


def run_queue_url(sqs: Any, *, prefix: str, run_id: str, kind: QueueKind) -> str | None:
    """The URL of one of a run's queues, found by its name; None when it does not exist."""
    try:
        return sqs.get_queue_url(QueueName=queue_name(prefix, run_id, kind))["QueueUrl"]
    except ClientError as error:
        if _is_missing(error):
            return None
        raise


def _create(sqs: Any, name: str, attributes: dict[str, str], tags: dict[str, str]) -> str:
    return sqs.create_queue(QueueName=name, Attributes=attributes, tags=tags)["QueueUrl"]


def _is_missing(error: ClientError) -> bool:
    code = error.response.get("Error", {}).get("Code", "")
    return code in (
        "AWS.SimpleQueueService.NonExistentQueue",
        "QueueDoesNotExist",
        "NonExistentQueue",
    )
