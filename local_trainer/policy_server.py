"""The local policy's generation side: answers the router's generate requests from the current
parameters (the run's trainer or evaluator drives the rollouts, domain/trainer_job.py)."""

from __future__ import annotations

import logging
import zlib
from typing import Any

import numpy as np

from domain.generate_plane import GeneratePlane, generate_response
from domain.protocol import (
    GenerateRequest,
    ProtocolError,
    parse,
)
from domain.run_queues import QueueKind
from domain.trainer_job import TrainingJob, delete_messages
from local_trainer.policy import Decision, Policy

log = logging.getLogger("mtrl.trainer")


class PolicyServer(GeneratePlane[Decision]):
    """Answers generate requests with the policy at `params` until stopped; the decisions taken
    for the samples being recorded are kept for the update that follows. Each answer says which
    `version` of the policy made it (the updates it has had)."""

    def __init__(
        self, job: TrainingJob, *, sqs: Any, policy: Policy, params: np.ndarray, version: int = 0
    ) -> None:
        super().__init__(job, sqs=sqs, version=version)
        self.policy = policy
        self._params = params

    @property
    def params(self) -> np.ndarray:
        with self._lock:
            return self._params.copy()

    @params.setter
    def params(self, value: np.ndarray) -> None:
        with self._lock:
            self._params = value

    def answer(self, messages: list[dict[str, Any]]) -> None:
        replies = []
        for message in messages:
            try:
                request = parse(GenerateRequest, message["Body"])
            except ProtocolError as error:
                log.warning("dropping a malformed generate request: %s", error)
                continue
            # A step asked again (a retried request) gets the same reply, counted once.
            decision = self.kept(request.sample_id, request.step_id)
            if decision is None:
                rng = np.random.default_rng([self.job.seed, zlib.crc32(request.step_id.encode())])
                decision = self.policy.decide(
                    self.params, [m.model_dump() for m in request.messages], rng
                )
                self.keep(request.sample_id, request.step_id, decision)
            replies.append(
                generate_response(
                    request,
                    message=decision.message,
                    finish_reason="stop",
                    tokens=[{"token": decision.text, "logprob": decision.logprob}],
                    version=self.version,
                )
            )
        self.send(replies)
        delete_messages(self.sqs, self.job.queues[QueueKind.GENERATE_REQUESTS], messages)
