"""The generate-response consumer: SQS batches from a run's `generate-responses` queue.

Each v0 generate response completes its step in the conversation table (conditionally: a
redelivered response changes nothing). Messages that are malformed, or name a step the run
never asked for, are reported as batch item failures: SQS retries them and then moves them to
the run's dead-letter queue, where they stay visible; the counters say how many of each.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict

from domain.protocol import GenerateResponse, ProtocolError, parse
from lambdas.clients import Clients, composed_once
from lambdas.router.conversations import ConversationStore
from lambdas.router.metrics import PROBLEMS_KEPT, Counts, metered_entry
from lambdas.router.settings import RouterSettings

log = logging.getLogger("mtrl.router.consumer")


class SqsRecord(BaseModel):
    model_config = ConfigDict(extra="ignore")

    messageId: str  # noqa: N815 - the event's own field name
    body: str
    eventSourceARN: str  # noqa: N815


class SqsEvent(BaseModel):
    model_config = ConfigDict(extra="ignore")

    Records: list[SqsRecord]  # noqa: N815


@dataclass
class ConsumerCounters(Counts):
    completed: int = 0
    duplicates: int = 0
    malformed: int = 0
    unknown_steps: int = 0
    unknown_queues: int = 0
    errors: int = 0
    problems: deque[str] = field(default_factory=lambda: deque(maxlen=PROBLEMS_KEPT))


class Consumer:
    def __init__(self, store: ConversationStore, *, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.clock = clock
        self.counters = ConsumerCounters()
        self._runs: dict[str, str | None] = {}

    def handle(self, raw_event: dict[str, Any]) -> dict[str, Any]:
        event = SqsEvent.model_validate(raw_event)
        failures = [
            {"itemIdentifier": record.messageId}
            for record in event.Records
            if not self._consume(record)
        ]
        return {"batchItemFailures": failures}

    def _consume(self, record: SqsRecord) -> bool:
        try:
            response = parse(GenerateResponse, record.body)
        except ProtocolError as problem:
            return self._problem("malformed", f"{record.messageId}: {problem}")
        run_id = self._run_of(record.eventSourceARN)
        if run_id is None:
            return self._problem(
                "unknown_queues",
                f"{record.messageId}: queue {record.eventSourceARN} belongs to no run",
            )
        try:
            outcome = self.store.complete_step(
                run_id, response.step_id, response.completion(), now=self.clock()
            )
        except Exception as error:  # noqa: BLE001 - retried by SQS via the batch failure
            return self._problem("errors", f"{record.messageId}: {type(error).__name__}: {error}")
        if outcome == "unknown":
            return self._problem(
                "unknown_steps",
                f"{record.messageId}: run {run_id} has no step {response.step_id!r}",
            )
        if outcome == "duplicate":
            self.counters.duplicates += 1
        else:
            self.counters.completed += 1
        return True

    def _run_of(self, queue_arn: str) -> str | None:
        if queue_arn not in self._runs:
            self._runs[queue_arn] = self.store.run_of_queue(queue_arn)
        return self._runs[queue_arn]

    def _problem(self, counter: str, detail: str) -> bool:
        setattr(self.counters, counter, getattr(self.counters, counter) + 1)
        self.counters.problems.append(detail)
        log.warning("generate response not recorded (%s): %s", counter, detail)
        return False


def consumer_for(environment: Mapping[str, str], clients: Clients) -> Consumer:
    """The consumer of a function with this environment (`RouterSettings`)."""
    settings = RouterSettings.from_environment(environment)
    return Consumer(ConversationStore(clients("dynamodb"), settings.table_name))


# The SQS event source's entry point (with ReportBatchItemFailures).
handler = metered_entry("consumer", composed_once(consumer_for, os.environ), os.environ)
