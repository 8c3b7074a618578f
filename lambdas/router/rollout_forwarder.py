"""The rollout Lambda: what a Nova trainer invokes with each v0 rollout request.

Nova's BYOO recipe names it `run.rollout_request_arn` (Nova user guide, "Reinforcement Learning",
BYOO recipe configuration; the trainer's Rollout component "delegates rollout generation to
Proxy Lambda"). It puts the request on the run's rollout-request queue, where the reward workers
take it.

A job's recipe names the function itself, unqualified, as AWS's Forge SDK passes its stack's
(amzn-nova-forge `RFTMultiturnInfrastructure._load_existing_stack`), so an invocation says
nothing of the run, and neither does a documented request. The forwarder serves the one run
that holds it (its lease in the conversation table, taken at Provision, released at teardown,
expiring with the run's registration: lambdas/router/conversations.py), as the SDK's stack
serves one job; a request while no run holds it is refused, so a run that is torn down cannot
be reached. Each request is asked for in the holder's open phase — training, or a held-out
evaluation — which is recorded for the sample before its request is queued, so its report is kept
in that phase and an evaluation's rollouts never enter the reward curve. A request that is not
valid v0 is refused with what is wrong — the trainer sees the failed invocation at once instead
of waiting for a rollout that never comes. A retried invocation carries the same request: its
deduplication id is the request's digest, so SQS keeps one (a sample asked for again in a later
step comes with a new timestamp, so it is a new one).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from domain.episodes import stage_of
from domain.protocol import RolloutRequest, dump, fifo_id, parse
from domain.run_queues import QueueKind, queue_name, run_queue_url
from lambdas.clients import Clients, composed_once
from lambdas.router.conversations import ConversationStore
from lambdas.router.metrics import Counts, metered_entry
from lambdas.router.settings import ForwarderSettings


class RolloutRefused(ValueError):
    """An invocation that cannot be forwarded; the text says why."""


@dataclass
class ForwarderCounters(Counts):
    forwarded: int = 0
    malformed: int = 0
    refused: int = 0


class RunQueueForwarder:
    """What a forwarder does once it knows a request's run: ask for the sample in the run's open
    phase, and put the request on the run's rollout-request queue."""

    def __init__(
        self,
        sqs: Any,
        store: ConversationStore,
        *,
        prefix: str,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.sqs, self.store = sqs, store
        self.prefix, self.clock = prefix, clock
        self.counters = ForwarderCounters()
        self._queues: dict[str, str] = {}  # run id -> its rollout-request queue URL

    def _forward(self, run_id: str, sample_id: str, body: str, *, group: str, once: str) -> str:
        """Queue `body` for the run's workers (`group`: its FIFO group; `once`: what makes a
        retried invocation the same message); the stage it was asked for in."""
        phase = self.store.phase(run_id)
        if phase is None:
            raise self._refused(f"run {run_id!r} has opened no phase yet: no job of it has started")
        queue, stage = self._queue_of(run_id), stage_of(phase)
        self.store.mark_sample(run_id, sample_id, stage=stage, now=self.clock())
        self.sqs.send_message(
            QueueUrl=queue,
            MessageBody=body,
            MessageGroupId=fifo_id(group),
            MessageDeduplicationId=hashlib.sha256(once.encode()).hexdigest(),
        )
        self.counters.forwarded += 1
        return stage

    def _refused(self, why: str) -> RolloutRefused:
        self.counters.refused += 1
        return RolloutRefused(why)

    def _queue_of(self, run_id: str) -> str:
        if run_id not in self._queues:
            kind = QueueKind.ROLLOUT_REQUESTS
            url = run_queue_url(self.sqs, prefix=self.prefix, run_id=run_id, kind=kind)
            if url is None:
                raise self._refused(
                    f"run {run_id!r} has no rollout-request queue "
                    f"({queue_name(self.prefix, run_id, kind)}): it was never provisioned or "
                    "is torn down"
                )
            self._queues[run_id] = url
        return self._queues[run_id]


Forwarder = TypeVar("Forwarder", bound=RunQueueForwarder)


class RolloutForwarder(RunQueueForwarder):
    def handle(self, request: Any) -> dict[str, Any]:
        body = request if isinstance(request, str) else json.dumps(request)
        try:
            parsed = parse(RolloutRequest, body)
        except ValueError:
            self.counters.malformed += 1
            raise
        run_id = self.store.rollout_lambda_holder(now=self.clock())
        if run_id is None:
            raise self._refused(
                "no Nova run is served by this rollout Lambda now: none holds it (none was "
                "provisioned, or its run is torn down)"
            )
        stage = self._forward(
            run_id, parsed.sample_id, dump(parsed), group=parsed.sample_id, once=body
        )
        return {"run_id": run_id, "sample_id": parsed.sample_id, "stage": stage, "forwarded": True}


def forwarder_for(
    environment: Mapping[str, str], clients: Clients, kind: type[Forwarder]
) -> Forwarder:
    """The forwarder of `kind` for a function with this environment (`ForwarderSettings`)."""
    settings = ForwarderSettings.from_environment(environment)
    store = ConversationStore(clients("dynamodb"), settings.table_name)
    return kind(clients("sqs"), store, prefix=settings.name_prefix)


_forward = metered_entry(
    "rollout-forwarder",
    composed_once(functools.partial(forwarder_for, kind=RolloutForwarder), os.environ),
    os.environ,
)


def handler(event: Any, context: Any) -> dict[str, Any]:
    """The Lambda entry point: the event is the rollout request itself."""
    return _forward(event, context)
