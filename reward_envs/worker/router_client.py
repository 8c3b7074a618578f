"""The worker's client for the router's proxy (Function URL, AWS_IAM): SigV4-signed HTTP.

`RouterClient.chat` is a `ModelClient`: it posts the conversation, and when the completion
is not ready within the proxy's short wait, polls the step with backoff until the rollout's
deadline, then raises `ModelTimeout` (the worker reports `stop_reason: timeout`).
`RouterRolloutQueues` makes the worker report finished rollouts through the proxy, so the
router's conversation state sees every rollout end. A rollout of a run's phase that has ended
(the proxy's 410 `phase_closed`) is dropped: its report is refused, so its request is deleted
without one.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from domain.protocol import RolloutReport, RolloutResponse, run_base_url
from reward_envs.interface import Message
from reward_envs.worker.model_client import (
    ModelClient,
    ModelTimeout,
    ModelTurn,
    PhaseClosed,
    answer_of,
    chat_request,
    model_turn,
)
from reward_envs.worker.queues import Delivery, ReportingQueues

log = logging.getLogger(__name__)


class RouterClient(ModelClient):
    def __init__(
        self,
        url: str,
        *,
        run_id: str,
        run_token: str,
        region: str,
        credentials: Callable[[], Credentials],
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._url = run_base_url(url, run_id, run_token)
        self._region = region
        self._credentials = credentials
        self._clock = clock
        self._sleep = sleep

    def chat(
        self,
        messages: Sequence[Message],
        *,
        sample_id: str,
        step_id: str,
        timeout: float,
        tools: Sequence[Mapping[str, Any]] = (),
    ) -> ModelTurn:
        deadline = self._clock() + timeout
        body = chat_request(messages, tools, sample_id=sample_id)
        status, answer = self._call("POST", "/v1/chat/completions", body, deadline)
        pause = 0.05
        while status == 202:
            step = answer.get("step_id", step_id)
            if self._clock() + pause >= deadline:
                raise ModelTimeout(
                    f"{step}: no completion within {timeout:.1f} s (status {answer.get('status')})"
                )
            self._sleep(pause)
            pause = min(pause * 2, 1.0)
            status, answer = self._call("GET", f"/v1/chat/completions/{step}", None, deadline)
            if status == 200 and answer.get("status") != "completed":
                status = 202
            elif status == 200:
                answer = answer["result"]
        return model_turn(answer, step_id)

    def report(self, response: RolloutResponse, *, request_id: str, timeout: float = 30.0) -> bool:
        """Report a finished rollout; True when it was recorded now, False for a duplicate."""
        report = RolloutReport(
            id=response.sample_id,
            aggregate_reward_score=response.aggregate_score,
            metrics_list=response.metrics,
            stop_reason=response.stop_reason,
            error=response.error,
            request_id=request_id,
        )
        _, answer = self._call(
            "POST", "/v1/rollouts/report", report.model_dump(mode="json"), self._clock() + timeout
        )
        return bool(answer.get("recorded"))

    def _call(
        self, method: str, path: str, body: Any, deadline: float
    ) -> tuple[int, dict[str, Any]]:
        remaining = deadline - self._clock()
        if remaining <= 0:
            raise ModelTimeout(f"{method} {path}: no time left")
        data = json.dumps(body).encode() if body is not None else None
        request = AWSRequest(
            method=method,
            url=self._url + path,
            data=data,
            headers={"content-type": "application/json"},
        )
        SigV4Auth(self._credentials(), "lambda", self._region).add_auth(request)
        prepared = urllib.request.Request(
            self._url + path, data=data, headers=dict(request.headers), method=method
        )
        return answer_of(prepared, timeout=remaining, what=f"{method} {path}", server="the router")


class RouterRolloutQueues(ReportingQueues):
    """Requests from SQS as usual; responses reported through the router's proxy."""

    def __init__(
        self, sqs: Any, router: RouterClient, *, requests_url: str, dead_letter_url: str | None
    ) -> None:
        super().__init__(
            sqs, self._to_router, requests_url=requests_url, dead_letter_url=dead_letter_url
        )
        self._router = router

    def _to_router(self, delivery: Delivery, response: RolloutResponse) -> None:
        report_to_router(self._router, delivery, response)


def report_to_router(router: RouterClient, delivery: Delivery, response: RolloutResponse) -> None:
    """A finished rollout among the run's reports (once however often it is sent); one whose
    phase has closed is dropped, and its request goes."""
    try:
        router.report(response, request_id=delivery.message_id)
    except PhaseClosed as closed:
        log.info("rollout %s dropped: %s", response.sample_id, closed)
