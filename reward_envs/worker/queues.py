"""The worker's view of its SQS FIFO queues: receive, extend, release, complete, dead-letter."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mtrl.protocol import RolloutResponse, dump


@dataclass(frozen=True)
class Delivery:
    message_id: str
    receipt_handle: str
    body: str
    receive_count: int
    group_id: str | None


class SqsRolloutQueues:
    """Rollout requests in, rollout responses out, poison messages to the dead-letter queue."""

    def __init__(
        self, sqs: Any, *, requests_url: str, responses_url: str, dead_letter_url: str | None
    ) -> None:
        self._sqs = sqs
        self.requests_url = requests_url
        self.responses_url = responses_url
        self.dead_letter_url = dead_letter_url

    def receive(
        self, *, max_messages: int, wait_seconds: int, visibility_timeout: int
    ) -> list[Delivery]:
        answer = self._sqs.receive_message(
            QueueUrl=self.requests_url,
            MaxNumberOfMessages=max(1, min(10, max_messages)),
            WaitTimeSeconds=wait_seconds,
            VisibilityTimeout=visibility_timeout,
            MessageSystemAttributeNames=["ApproximateReceiveCount", "MessageGroupId"],
        )
        return [
            Delivery(
                message_id=message["MessageId"],
                receipt_handle=message["ReceiptHandle"],
                body=message["Body"],
                receive_count=int(
                    message.get("Attributes", {}).get("ApproximateReceiveCount", "1")
                ),
                group_id=message.get("Attributes", {}).get("MessageGroupId"),
            )
            for message in answer.get("Messages", [])
        ]

    def extend(self, delivery: Delivery, seconds: int) -> None:
        self._sqs.change_message_visibility(
            QueueUrl=self.requests_url,
            ReceiptHandle=delivery.receipt_handle,
            VisibilityTimeout=seconds,
        )

    def release(self, delivery: Delivery, *, delay_seconds: int = 0) -> None:
        """Give the request back to the queue (another worker, or this one later, takes it)."""
        self.extend(delivery, delay_seconds)

    def complete(self, delivery: Delivery, response: RolloutResponse) -> None:
        """Send the response, then delete the request.

        The response's deduplication id is the request's message id: if the request is ever
        processed twice (a lost delete, a redelivery), SQS drops the second response.
        """
        self._sqs.send_message(
            QueueUrl=self.responses_url,
            MessageBody=dump(response),
            MessageGroupId=response.sample_id,
            MessageDeduplicationId=delivery.message_id,
        )
        self._sqs.delete_message(QueueUrl=self.requests_url, ReceiptHandle=delivery.receipt_handle)

    def dead_letter(self, delivery: Delivery, reason: str) -> None:
        if self.dead_letter_url is None:
            raise RuntimeError("no dead-letter queue configured")
        self._sqs.send_message(
            QueueUrl=self.dead_letter_url,
            MessageBody=delivery.body,
            MessageGroupId=delivery.group_id or "poison",
            MessageDeduplicationId=delivery.message_id,
            MessageAttributes={
                "reason": {"DataType": "String", "StringValue": reason[:1000]},
                "source_message_id": {"DataType": "String", "StringValue": delivery.message_id},
            },
        )
        self._sqs.delete_message(QueueUrl=self.requests_url, ReceiptHandle=delivery.receipt_handle)
