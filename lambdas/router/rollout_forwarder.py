"""The rollout Lambda: what a Nova trainer invokes with each v0 rollout request.

Nova's BYOO recipe names it `run.rollout_request_arn` (Nova user guide, "Reinforcement Learning",
BYOO recipe configuration; the trainer's Rollout component "delegates rollout generation to
Proxy Lambda"). It puts the request on the run's rollout-request queue, where the reward workers
take it.

One function serves every run, and each run invokes it through aliases of its own, named after
the run (created with the run's queues, deleted at teardown: `rollout_aliases.py`).
The run is the alias the invocation came through (`context.invoked_function_arn`), so concurrent
runs never mix and a run that is torn down cannot be reached; an invocation of the bare function
is refused. The alias also says the phase — training, or a held-out evaluation — which is
recorded for the sample before its request is queued, so its report is kept in that phase
(lambdas/router/conversations.py) and an evaluation's rollouts never enter the reward curve.
Once the pipeline opened another phase of the run, an invocation through an ended phase's alias is
refused too (what a phase left running never reaches the next one). A request that is not
valid v0 is refused with what is wrong — the trainer sees the failed
invocation at once instead of waiting for a rollout that never comes. A retried
invocation carries the same request: its deduplication id is the request's digest, so SQS keeps
one (a sample asked for again in a later step comes with a new timestamp, so it is a new one).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict

from domain.episodes import phase_of
from domain.protocol import RolloutRequest, dump, fifo_id, parse
from domain.run_queues import QueueKind, queue_name, run_queue_url
from lambdas.clients import Clients, composed_once
from lambdas.router.conversations import ConversationStore
from lambdas.router.metrics import Counts, metered_entry
from lambdas.router.rollout_aliases import run_of
from lambdas.router.settings import ForwarderSettings


class Invocation(BaseModel):
    """A rollout request and the ARN it was invoked by (the entry point puts them together)."""

    model_config = ConfigDict(frozen=True)

    request: Any
    invoked_function_arn: str


class RolloutRefused(ValueError):
    """An invocation that cannot be forwarded; the text says why."""


@dataclass
class ForwarderCounters(Counts):
    forwarded: int = 0
    malformed: int = 0
    refused: int = 0


class RolloutForwarder:
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

    def handle(self, raw: dict[str, Any]) -> dict[str, Any]:
        invocation = Invocation.model_validate(raw)
        invoked = run_of(invocation.invoked_function_arn)
        if invoked is None:
            self.counters.refused += 1
            raise RolloutRefused(
                f"invoked as {invocation.invoked_function_arn}: invoke the run's alias "
                "(<function ARN>:<run id>[_<evaluation>]), the rollout_request_arn its recipe "
                "names"
            )
        run_id = invoked.run_id
        body = (
            invocation.request
            if isinstance(invocation.request, str)
            else json.dumps(invocation.request)
        )
        try:
            request = parse(RolloutRequest, body)
        except ValueError:
            self.counters.malformed += 1
            raise
        queue = self._queue_of(run_id)
        asked_in, open_phase = phase_of(invoked.stage), self.store.phase(run_id)
        if open_phase is not None and open_phase != asked_in:
            self.counters.refused += 1
            raise RolloutRefused(
                f"invoked through the {asked_in} phase's alias of run {run_id!r}, which has "
                f"ended (the {open_phase} phase is open)"
            )
        self.store.mark_sample(run_id, request.sample_id, stage=invoked.stage, now=self.clock())
        self.sqs.send_message(
            QueueUrl=queue,
            MessageBody=dump(request),
            MessageGroupId=fifo_id(request.sample_id),
            MessageDeduplicationId=hashlib.sha256(body.encode()).hexdigest(),
        )
        self.counters.forwarded += 1
        return {
            "run_id": run_id,
            "sample_id": request.sample_id,
            "stage": invoked.stage,
            "forwarded": True,
        }

    def _queue_of(self, run_id: str) -> str:
        if run_id not in self._queues:
            kind = QueueKind.ROLLOUT_REQUESTS
            url = run_queue_url(self.sqs, prefix=self.prefix, run_id=run_id, kind=kind)
            if url is None:
                self.counters.refused += 1
                raise RolloutRefused(
                    f"run {run_id!r} has no rollout-request queue "
                    f"({queue_name(self.prefix, run_id, kind)}): it was never provisioned or "
                    "is torn down"
                )
            self._queues[run_id] = url
        return self._queues[run_id]


def forwarder_for(environment: Mapping[str, str], clients: Clients) -> RolloutForwarder:
    """The forwarder of a function with this environment (`ForwarderSettings`)."""
    settings = ForwarderSettings.from_environment(environment)
    store = ConversationStore(clients("dynamodb"), settings.table_name)
    return RolloutForwarder(clients("sqs"), store, prefix=settings.name_prefix)


_forward = metered_entry("rollout-forwarder", composed_once(forwarder_for, os.environ), os.environ)


def handler(event: Any, context: Any) -> dict[str, Any]:
    """The Lambda entry point: the event is the rollout request itself."""
    return _forward(
        {"request": event, "invoked_function_arn": context.invoked_function_arn}, context
    )
