"""The reward worker's agent mode, for a serverless run: its queue carries the managed job's
rollout requests (lambdas/router/agent_forwarder.py puts them there), each naming a trajectory
of the job. The worker plays each against the job's policy (`RuntimeModel`: a `Sample` call a
turn) and reports it to the job's runtime service (`RuntimeFeedback`: completed with the
episode's reward, or failed — never a silent 0) where a HyperPod run's worker answers on the
run's response queue — and, given the run's router, among the run's rollout reports too, as a
Nova run's workers report them: the run's reward curve and its evaluations' episodes are made
from those (lambdas/pipeline/reward_curve.py). The environments, the trajectory store and the
worker loop are the same.
"""

from __future__ import annotations

import threading
from typing import Any

from pydantic import ValidationError

from domain.agent_rft import AgentRolloutRequest, NotARollout, rollout_request_of
from domain.protocol import ProtocolError, RolloutRequest, RolloutResponse
from reward_envs.worker.job_runtime import RuntimeFeedback, RuntimeFor, RuntimeModel
from reward_envs.worker.model_client import ModelClient
from reward_envs.worker.queues import Delivery, ReportingQueues
from reward_envs.worker.router_client import RouterClient, report_to_router


class AgentMode:
    """What the worker loop needs to play a managed job's requests: `read` (a queued request as
    the rollout to play), `model` (each rollout's turns from its own trajectory) and `queues`
    (its report to the job's runtime service)."""

    def __init__(self, runtime_for: RuntimeFor, *, max_length: int) -> None:
        self._runtime_for = runtime_for
        self._max_length = max_length
        self._playing: dict[str, AgentRolloutRequest] = {}  # by sample id, until reported
        self._lock = threading.Lock()
        self.model: ModelClient = RuntimeModel(runtime_for, self.playing)

    def read(self, body: str) -> RolloutRequest:
        request, rollout = self._parsed(body)
        with self._lock:
            self._playing[rollout.sample_id] = request
        return rollout

    def forget(self, body: str) -> None:
        """A queued request this worker no longer plays (given back, or dead-lettered): its
        trajectory is not kept for it (a request it could not read was never kept)."""
        try:
            _, rollout = self._parsed(body)
        except ProtocolError:
            return
        with self._lock:
            self._playing.pop(rollout.sample_id, None)

    def _parsed(self, body: str) -> tuple[AgentRolloutRequest, RolloutRequest]:
        """The service's request and the rollout a worker plays for it."""
        try:
            request = AgentRolloutRequest.model_validate_json(body)
            return request, rollout_request_of(request, max_length=self._max_length)
        except (ValidationError, NotARollout) as error:
            raise ProtocolError(f"not a managed job's rollout request: {error}") from None

    def playing(self, sample_id: str) -> AgentRolloutRequest:
        with self._lock:
            return self._playing[sample_id]

    def report(self, response: RolloutResponse) -> None:
        """The rollout to the job's runtime service, once (the request it played, as `read`
        kept it)."""
        request = self.playing(response.sample_id)
        feedback = RuntimeFeedback(self._runtime_for(request.metadata))
        if response.aggregate_score is None:
            feedback.failed(request.metadata, response.error or response.stop_reason)
        else:
            feedback.completed(request.metadata, response.aggregate_score)
        with self._lock:
            self._playing.pop(response.sample_id, None)

    def queues(
        self,
        sqs: Any,
        *,
        requests_url: str,
        dead_letter_url: str | None,
        router: RouterClient | None = None,
    ) -> AgentQueues:
        return AgentQueues(
            sqs, self, requests_url=requests_url, dead_letter_url=dead_letter_url, router=router
        )


class AgentQueues(ReportingQueues):
    """The run's request queue as a HyperPod run's worker reads it; a finished rollout goes
    (with `router`) among the run's reports, then to the job's runtime service instead of a
    response queue — in that order: once the runtime has every rollout of an evaluation job,
    the job may complete and its episodes are read from the run's reports
    (lambdas/pipeline/reward_curve.evaluation_from_reports), so none may still be on its way.
    A report that fails leaves the request to be played and reported again: both sides take a
    rollout once (the router by the sample, the runtime by its ClientToken)."""

    def __init__(
        self,
        sqs: Any,
        mode: AgentMode,
        *,
        requests_url: str,
        dead_letter_url: str | None,
        router: RouterClient | None = None,
    ) -> None:
        super().__init__(
            sqs, self._report_one_rollout, requests_url=requests_url,
            dead_letter_url=dead_letter_url,
        )  # fmt: skip
        self._mode, self._router = mode, router

    def release(self, delivery: Delivery, *, delay_seconds: int = 0) -> None:
        super().release(delivery, delay_seconds=delay_seconds)
        self._mode.forget(delivery.body)

    def dead_letter(self, delivery: Delivery, reason: str) -> None:
        super().dead_letter(delivery, reason)
        self._mode.forget(delivery.body)

    def _report_one_rollout(self, delivery: Delivery, response: RolloutResponse) -> None:
        if self._router is not None:
            report_to_router(self._router, delivery, response)
        self._mode.report(response)
