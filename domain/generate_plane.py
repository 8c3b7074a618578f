"""What both our trainers' generation sides share: a thread that answers the run's generate
requests until stopped, and what it produced for the samples of the steps in flight, kept per
sample and step for the update that follows (a retried step is answered from it, not sampled
again). The local policy's server and the open-weights generation service say how to answer."""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from collections import defaultdict
from collections.abc import Iterable
from typing import Any, Generic, TypeVar

from domain.protocol import Choice, GenerateRequest, GenerateResponse, dump, fifo_id, turn_of
from domain.run_queues import QueueKind
from domain.trainer_job import TrainingJob

log = logging.getLogger("mtrl.trainer")
Kept = TypeVar("Kept")
# How long stopping waits for a batch in flight to end: a generator that cannot be interrupted
# (vLLM's batch) finishes it first.
STOP_WAIT_SECONDS = 300


def generate_response(
    request: GenerateRequest,
    *,
    message: Any,
    finish_reason: str,
    tokens: list[dict[str, Any]],
    version: int,
) -> GenerateResponse:
    """The v0 answer to `request`: the assistant message, its tokens with their
    log-probabilities, why it ended, and the version of the weights that wrote it."""
    return GenerateResponse(
        sample_id=request.sample_id,
        step_id=request.step_id,
        data={
            "choices": [
                Choice(message=message, finish_reason=finish_reason, logprobs={"content": tokens})
            ],
            "policy_version": version,
        },
        finish_reason=finish_reason,
    )


class GeneratePlane(ABC, Generic[Kept]):
    def __init__(self, job: TrainingJob, *, sqs: Any, version: int = 0) -> None:
        self.job, self.sqs = job, sqs
        self.version = version  # the updates the weights answering now have had
        self._lock = threading.Lock()
        self._kept: dict[str, dict[str, Kept]] = defaultdict(dict)  # sample -> step -> kept
        self._recorded: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._answer_forever, name="generate", daemon=True)

    @abstractmethod
    def answer(self, messages: list[dict[str, Any]]) -> None:
        """Answer these generate-request queue messages."""

    def receive(self) -> list[dict[str, Any]]:
        return self.sqs.receive_message(
            QueueUrl=self.job.queues[QueueKind.GENERATE_REQUESTS],
            MaxNumberOfMessages=10,
            WaitTimeSeconds=1,
        ).get("Messages", [])

    def send(self, responses: list[GenerateResponse]) -> None:
        """The answers onto the generate-response queue, in order per conversation, each step
        once (its step id deduplicates a retry)."""
        entries = [
            {
                "Id": str(index),
                "MessageBody": dump(response),
                "MessageGroupId": fifo_id(response.sample_id),
                "MessageDeduplicationId": fifo_id(response.step_id),
            }
            for index, response in enumerate(responses)
        ]
        url = self.job.queues[QueueKind.GENERATE_RESPONSES]
        for start in range(0, len(entries), 10):
            self.sqs.send_message_batch(QueueUrl=url, Entries=entries[start : start + 10])

    def record(self, samples: Iterable[str]) -> None:
        """Keep what is produced for these samples from now on, besides those already kept for
        (the samples of a step in flight while another is played)."""
        with self._lock:
            self._recorded |= set(samples)

    def recorded(self, samples: Iterable[str]) -> dict[str, list[Kept]]:
        """What was kept for these samples, per sample in turn order; stops keeping for them."""
        wanted = set(samples)
        with self._lock:
            kept = {
                sample: [steps[step] for step in sorted(steps, key=turn_of)]
                for sample in wanted
                if (steps := self._kept.pop(sample, None))
            }
            self._recorded -= wanted
        return kept

    def kept(self, sample_id: str, step_id: str) -> Kept | None:
        with self._lock:
            return self._kept.get(sample_id, {}).get(step_id)

    def keep(self, sample_id: str, step_id: str, item: Kept) -> None:
        """Keep `item` for the step, when its sample is being recorded."""
        with self._lock:
            if sample_id in self._recorded:
                self._kept[sample_id][step_id] = item

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop answering, and return once the answering thread has ended: a batch in flight is
        asked to stop (`stopped`) and is not answered. A thread left inside a native library
        (torch) when the interpreter exits aborts the process."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=STOP_WAIT_SECONDS)
        if self._thread.is_alive():
            log.error("the generate thread is still answering after %s s", STOP_WAIT_SECONDS)

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def _answer_forever(self) -> None:
        while not self._stop.is_set():
            try:
                messages = self.receive()
                if messages:
                    self.answer(messages)
            except Exception:  # noqa: BLE001 - a failed batch must not end the generate plane
                if self._stop.is_set():
                    return
                log.exception("answering generate requests failed; retrying")
                self._stop.wait(0.5)
