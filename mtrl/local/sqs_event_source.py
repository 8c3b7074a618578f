"""An SQS event source mapping, locally: poll a queue, invoke the handler with a batch, delete
what succeeded, leave the reported failures for SQS to retry (and its redrive policy to
dead-letter), as Lambda does with ReportBatchItemFailures."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from botocore.exceptions import ClientError

log = logging.getLogger("mtrl.local.sqs")

Handler = Callable[[dict[str, Any], Any], dict[str, Any]]


class SqsEventSource:
    def __init__(
        self,
        sqs: Any,
        queue_url: str,
        handler: Handler,
        *,
        batch_size: int = 10,
        wait_seconds: int = 1,
    ) -> None:
        self._sqs = sqs
        self._url = queue_url
        self._arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])[
            "Attributes"
        ]["QueueArn"]
        self._handler = handler
        self._batch_size = batch_size
        self._wait_seconds = wait_seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._loop, name=f"event-source:{self._arn}", daemon=True
        )
        self.invocations = 0

    def __enter__(self) -> SqsEventSource:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)

    def stop(self) -> None:
        """Stop polling after the current batch (does not wait)."""
        self._stop.set()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def poll_once(self, wait_seconds: int = 0) -> int:
        """One receive and one invocation; returns how many messages were handled."""
        messages = self._sqs.receive_message(
            QueueUrl=self._url,
            MaxNumberOfMessages=self._batch_size,
            WaitTimeSeconds=wait_seconds,
            MessageSystemAttributeNames=["All"],
        ).get("Messages", [])
        if not messages:
            return 0
        event = {
            "Records": [
                {
                    "messageId": message["MessageId"],
                    "receiptHandle": message["ReceiptHandle"],
                    "body": message["Body"],
                    "attributes": message.get("Attributes", {}),
                    "eventSource": "aws:sqs",
                    "eventSourceARN": self._arn,
                }
                for message in messages
            ]
        }
        self.invocations += 1
        try:
            result = self._handler(event, None) or {}
            failed = {item["itemIdentifier"] for item in result.get("batchItemFailures", [])}
        except Exception:  # noqa: BLE001 - as Lambda: a failed invocation retries the whole batch
            log.exception("handler failed; the batch returns to the queue")
            failed = {message["MessageId"] for message in messages}
        done = [m for m in messages if m["MessageId"] not in failed]
        for start in range(0, len(done), 10):
            self._sqs.delete_message_batch(
                QueueUrl=self._url,
                Entries=[
                    {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                    for i, m in enumerate(done[start : start + 10])
                ],
            )
        return len(messages)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                handled = self.poll_once(self._wait_seconds)
            except self._sqs.exceptions.QueueDoesNotExist:
                log.info("%s was deleted; its event source stops", self._arn)
                return
            except ClientError as error:  # as Lambda's poller: log, back off, go on
                log.warning("polling %s failed: %s", self._arn, error)
                self._stop.wait(1.0)
                continue
            if not handled and not self._wait_seconds:
                self._stop.wait(0.01)  # short polls need a pause when the queue is empty
