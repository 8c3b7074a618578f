"""The worker's view of its SQS FIFO queues: receive, extend, release, complete, dead-letter."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from domain.protocol import RolloutResponse, dump, fifo_id


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

    def complete(self, finished: list[tuple[Delivery, RolloutResponse]]) -> list[Exception | None]:
        """Report the responses, then delete their requests; per item, None or the error.

        A response's deduplication id is its request's message id: if a request is ever
        processed twice (a lost delete, a redelivery), SQS drops the second response. Entries
        of one message group keep their order.
        """
        outcome = self._report(finished)
        delivered = [
            delivery
            for (delivery, _), error in zip(finished, outcome, strict=True)
            if error is None
        ]
        for start in range(0, len(delivered), 10):
            # A failed delete only means a redelivery, whose response SQS deduplicates.
            self._sqs.delete_message_batch(
                QueueUrl=self.requests_url,
                Entries=[
                    {"Id": str(i), "ReceiptHandle": d.receipt_handle}
                    for i, d in enumerate(delivered[start : start + 10])
                ],
            )
        return outcome

    def _report(self, finished: list[tuple[Delivery, RolloutResponse]]) -> list[Exception | None]:
        """Send the responses straight to the rollout-responses queue, ten per call."""
        outcome: list[Exception | None] = [None] * len(finished)
        for start in range(0, len(finished), 10):
            chunk = list(enumerate(finished))[start : start + 10]
            sent = self._sqs.send_message_batch(
                QueueUrl=self.responses_url,
                Entries=[
                    {
                        "Id": str(index),
                        "MessageBody": dump(response),
                        "MessageGroupId": fifo_id(response.sample_id),
                        "MessageDeduplicationId": fifo_id(delivery.message_id),
                    }
                    for index, (delivery, response) in chunk
                ],
            )
            for failure in sent.get("Failed", []):
                outcome[int(failure["Id"])] = RuntimeError(
                    f"send failed: {failure.get('Code')}: {failure.get('Message')}"
                )
        return outcome

    def dead_letter(self, delivery: Delivery, reason: str) -> None:
        if self.dead_letter_url is None:
            raise RuntimeError("no dead-letter queue configured")
        self._sqs.send_message(
            QueueUrl=self.dead_letter_url,
            MessageBody=delivery.body,
            MessageGroupId=fifo_id(delivery.group_id or "poison"),
            MessageDeduplicationId=fifo_id(delivery.message_id),
            MessageAttributes={
                "reason": {"DataType": "String", "StringValue": reason[:1000]},
                "source_message_id": {"DataType": "String", "StringValue": delivery.message_id},
            },
        )
        self._sqs.delete_message(QueueUrl=self.requests_url, ReceiptHandle=delivery.receipt_handle)


class ReportingQueues(SqsRolloutQueues):
    """Requests from SQS as usual; each finished rollout handed to `report` instead of a response
    queue (the router's proxy, a managed job's runtime service). A report that raises leaves
    its request to be retried; one that returns deletes it."""

    def __init__(
        self,
        sqs: Any,
        report: Callable[[Delivery, RolloutResponse], None],
        *,
        requests_url: str,
        dead_letter_url: str | None,
    ) -> None:
        super().__init__(
            sqs, requests_url=requests_url, responses_url="", dead_letter_url=dead_letter_url
        )
        self._report_one = report

    def _report(self, finished: list[tuple[Delivery, RolloutResponse]]) -> list[Exception | None]:
        outcome: list[Exception | None] = []
        for delivery, response in finished:
            try:
                self._report_one(delivery, response)
                outcome.append(None)
            except Exception as error:  # noqa: BLE001 - the request is retried, not lost
                outcome.append(error)
        return outcome
