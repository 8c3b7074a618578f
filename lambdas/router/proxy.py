"""The router's proxy: an OpenAI-shaped HTTP API (Lambda Function URL, AWS_IAM auth).

- `POST /v1/chat/completions`: records the model turn, enqueues a v0 generate request on the
  run's queue, waits a short bounded time for the completion: 200 with the completion, or
  202 `{"step_id", "status"}` to poll.
- `GET /v1/chat/completions/{step_id}`: `{"step_id", "status", "result"}`.
- `POST /v1/rollouts/report`: a finished rollout, forwarded once as a v0 rollout response. For
  a sample Nova's trainer asked for through the rollout Lambda, the response is the documented
  one and nothing more (`domain.protocol.NovaRolloutResponse`); a failed rollout of such a sample
  has no documented form and is not sent (the recipe's `rollout.timeout` bounds the trainer's
  wait). Every report is recorded whole, failed or not, for the run's records and health.

Every call is made under its run's base URL, `<router URL>/runs/<run id>/<run token>`
(`domain.protocol.run_base_url`), and the token is checked against the run's token hash: a caller
can only touch its own run. Nothing else is asked of a client but SigV4 and OpenAI-shaped
bodies, so Nova's starter-kit client, given only that base URL, works as it is. A warm proxy
reads a run's registration again after `RUN_CACHE_SECONDS`, not on every model turn (a
registration that is gone, expired by the table's TTL, is refused at most that much later; the
run's queues are deleted at teardown, so nothing reaches them in between). The turn is
identified by the body's `sample_id` (or its `user`) and the number of assistant messages so
far, so a retried call maps to the same step: it is answered from the step's record, or, while
the step is still pending, its generate request is sent again under the same deduplication id
(SQS drops the repeat within its 5-minute window; an answer that still comes twice is recorded
once). A step is written once when it starts and once when its answer comes.

A sample asked for through the rollout Lambda belongs to a phase of its run (the baseline
evaluation, training, the final evaluation; lambdas/router/rollout_forwarder.py). Once the
pipeline opened the next phase, the turns and report of a sample of an ended phase are refused
with 410 `phase_closed` before anything is queued: what a phase left running never reaches the
next phase's job (the pipeline empties the run's queues as it opens a phase, and nothing of the
old phase is sent after). The open phase is read on every such call, never cached.
"""

from __future__ import annotations

import base64
import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from domain.episodes import Episode, EvaluationStage
from domain.protocol import (
    ID_LENGTH,
    MAX_BODY_BYTES,
    ChatCompletionRequest,
    GenerateRequest,
    RolloutReport,
    StepStatus,
    chat_completion,
    dump,
    fifo_id,
    record_id_of,
    split_run_path,
    step_id_for,
)
from domain.run_queues import QueueKind
from lambdas.clients import Clients, composed_once
from lambdas.router.conversations import ConversationStore, RouterRegistration, Step
from lambdas.router.metrics import Counts, metered_entry
from lambdas.router.settings import RouterSettings

COMPLETIONS = "/v1/chat/completions"
REPORT = "/v1/rollouts/report"
RUN_CACHE_SECONDS = 10.0
RUN_CACHE_SIZE = 64  # runs a warm proxy remembers (one router serves every run)


class FunctionUrlEvent(BaseModel):
    """The parts of a Lambda Function URL (payload 2.0) event the proxy reads."""

    model_config = ConfigDict(extra="ignore")

    rawPath: str  # noqa: N815 - the event's own field name
    body: str | None = None
    isBase64Encoded: bool = False  # noqa: N815
    requestContext: dict[str, Any] = Field(default_factory=dict)  # noqa: N815

    @property
    def method(self) -> str:
        return str(self.requestContext.get("http", {}).get("method", "GET")).upper()

    @property
    def signed(self) -> bool:
        return bool(self.requestContext.get("authorizer", {}).get("iam"))

    def raw_body(self) -> bytes:
        if self.body is None:
            return b""
        return base64.b64decode(self.body) if self.isBase64Encoded else self.body.encode()


@dataclass
class HttpError(Exception):
    status: int
    message: str
    kind: str = "invalid_request_error"


@dataclass
class ProxyCounters(Counts):
    requests: int = 0
    client_errors: int = 0
    enqueued: int = 0
    retried_steps: int = 0
    reports: int = 0
    duplicate_reports: int = 0
    unsent_reports: int = 0  # failed rollouts of Nova's samples: no documented form to send


class Proxy:
    def __init__(
        self,
        store: ConversationStore,
        sqs: Any,
        *,
        wait_seconds: float,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        step_changes: Callable[[str, float], None] | None = None,
    ) -> None:
        """`step_changes(step_id, seconds)`, when given, replaces the pause between reads of a
        step: it returns when the step may have changed (or after `seconds`). On Lambda nothing
        announces a completion, so the proxy polls with backoff; in one process it need not."""
        self.store = store
        self.sqs = sqs
        self.wait_seconds = wait_seconds
        self.clock = clock
        self.sleep = sleep
        self.step_changes = step_changes
        self.counters = ProxyCounters()
        self._runs: dict[str, tuple[float, RouterRegistration]] = {}  # run id -> (until, run)

    def handle(self, raw_event: dict[str, Any]) -> dict[str, Any]:
        self.counters.requests += 1
        try:
            event = FunctionUrlEvent.model_validate(raw_event)
            status, body = self._route(event)
        except ValidationError:
            status, body = _error(HttpError(400, "not a Function URL event"))
        except HttpError as problem:
            status, body = _error(problem)
        if 400 <= status < 500:
            self.counters.client_errors += 1
        return {
            "statusCode": status,
            "headers": {"content-type": "application/json"},
            "body": json.dumps(body),
        }

    def _route(self, event: FunctionUrlEvent) -> tuple[int, dict[str, Any]]:
        if not event.signed:
            raise HttpError(
                401,
                "requests must be signed with AWS SigV4 (Function URL AWS_IAM auth)",
                "auth_error",
            )
        method = event.method
        under_run = split_run_path(event.rawPath.rstrip("/"))
        if under_run is None:
            raise HttpError(
                404,
                f"no route {method} {event.rawPath}: call under the run's base URL, "
                "<router URL>/runs/<run id>/<run token>",
                "not_found",
            )
        run_id, token, path = under_run
        run = self._run(run_id, token)
        if path == COMPLETIONS and method == "POST":
            return self._chat(event, run)
        if path.startswith(COMPLETIONS + "/") and method == "GET":
            return self._status(run, path.removeprefix(COMPLETIONS + "/"))
        if path == REPORT and method == "POST":
            return self._report(event, run)
        if path in (COMPLETIONS, REPORT) or path.startswith(COMPLETIONS + "/"):
            raise HttpError(405, f"{method} is not allowed on {path}")
        raise HttpError(
            404, f"no route {method} {path}: use {COMPLETIONS} or {REPORT}", "not_found"
        )

    def _run(self, run_id: str, token: str) -> RouterRegistration:
        run = self._registration(run_id)
        if run is None or not run.accepts(token, now=self.clock()):
            raise HttpError(
                403,
                f"not allowed for run {run_id!r}: check the run id and token in the base URL",
                "auth_error",
            )
        return run

    def _registration(self, run_id: str) -> RouterRegistration | None:
        """The run's registration, as read at most `RUN_CACHE_SECONDS` ago (an unknown run is
        read every time: it may have just been registered)."""
        now = self.clock()
        cached = self._runs.get(run_id)
        if cached is not None and now < cached[0]:
            return cached[1]
        run = self.store.get_run(run_id)
        self._runs.pop(run_id, None)
        if run is not None:
            if len(self._runs) >= RUN_CACHE_SIZE:
                self._runs.pop(next(iter(self._runs)))  # the oldest read
            self._runs[run_id] = (now + RUN_CACHE_SECONDS, run)
        return run

    def _body(self, event: FunctionUrlEvent, model: type[BaseModel]) -> Any:
        raw = event.raw_body()
        if len(raw) > MAX_BODY_BYTES:
            raise HttpError(413, f"body of {len(raw)} bytes exceeds {MAX_BODY_BYTES}")
        try:
            return model.model_validate_json(raw or b"{}")
        except ValidationError as error:
            first = error.errors(include_url=False)[0]
            where = ".".join(str(part) for part in first["loc"]) or "body"
            raise HttpError(400, f"{where}: {first['msg']}") from None

    def _chat(self, event: FunctionUrlEvent, run: RouterRegistration) -> tuple[int, dict[str, Any]]:
        request: ChatCompletionRequest = self._body(event, ChatCompletionRequest)
        sample_id = request.sample_id or request.user
        if not sample_id or len(sample_id) > ID_LENGTH:
            raise HttpError(
                400, f"name the sample in the body's sample_id (1-{ID_LENGTH} characters)"
            )
        self._fence(run, sample_id)
        turn = 1 + sum(1 for message in request.messages if message.role == "assistant")
        step_id = step_id_for(sample_id, turn)
        now = self.clock()
        if turn == 1:
            self.store.begin_rollout(run.run_id, sample_id, now=now)
        known: Step | None = None  # just enqueued: its answer cannot be in yet
        if self.store.start_step(run.run_id, step_id, sample_id=sample_id, now=now):
            self._enqueue(run, sample_id, step_id, request)
        else:
            self.counters.retried_steps += 1
            known = self.store.get_step(run.run_id, step_id)
            if known is not None and known.status == "pending":
                self._enqueue(run, sample_id, step_id, request)  # the first try may have died
                known = None
        return self._wait_for(run, step_id, known)

    def _fence(self, run: RouterRegistration, sample_id: str) -> str | None:
        """The phase the sample was asked for in (None: not through the rollout Lambda); refused
        when the run has opened another since."""
        asked_in = self.store.sample_phase(run.run_id, sample_id)
        if asked_in is None:
            return None
        open_phase = self.store.phase(run.run_id)
        if open_phase is not None and open_phase != asked_in:
            raise HttpError(
                410,
                f"sample {sample_id!r} was asked for in the {asked_in} phase of run "
                f"{run.run_id!r}, which has ended (the {open_phase} phase is open): its turns and "
                "report are no longer taken; drop the rollout",
                "phase_closed",
            )
        return asked_in

    def _enqueue(
        self, run: RouterRegistration, sample_id: str, step_id: str, request: ChatCompletionRequest
    ) -> None:
        generate = GenerateRequest(
            sample_id=sample_id,
            step_id=step_id,
            messages=request.messages,
            tools=request.tools,
            tool_choice=request.tool_choice,
        )
        self.sqs.send_message(
            QueueUrl=run.queues[QueueKind.GENERATE_REQUESTS],
            MessageBody=dump(generate),
            MessageGroupId=fifo_id(sample_id),
            MessageDeduplicationId=fifo_id(step_id),
        )
        self.counters.enqueued += 1

    def _wait_for(
        self, run: RouterRegistration, step_id: str, step: Step | None
    ) -> tuple[int, dict[str, Any]]:
        """The step's answer if it comes within the wait, else 202 (still pending). `step`: what
        is known of it (None: just enqueued, so the first read comes after the first pause)."""
        deadline = self.clock() + self.wait_seconds
        pause = 0.02
        while True:
            if step is not None and step.status == "completed" and step.result is not None:
                return 200, chat_completion(
                    step_id, step.result, created=self.clock(), model=run.model
                )
            if step is not None and step.status == "failed":
                raise HttpError(502, f"generation of step {step_id} failed", "generation_error")
            if self.clock() >= deadline:  # neither answered nor failed: pending (or expired)
                return 202, StepStatus(step_id=step_id, status="pending").model_dump()
            remaining = max(0.0, deadline - self.clock())
            if self.step_changes is not None:
                self.step_changes(step_id, remaining)
            else:
                self.sleep(min(pause, remaining))
                pause = min(pause * 2, 0.5)
            step = self.store.get_step(run.run_id, step_id)

    def _status(self, run: RouterRegistration, step_id: str) -> tuple[int, dict[str, Any]]:
        step = self.store.get_step(run.run_id, step_id)
        if step is None:
            raise HttpError(404, f"no step {step_id!r} in run {run.run_id!r}", "not_found")
        result = (
            chat_completion(step_id, step.result, created=step.updated_at, model=run.model)
            if step.result is not None
            else None
        )
        return 200, StepStatus(step_id=step_id, status=step.status, result=result).model_dump()

    def _report(
        self, event: FunctionUrlEvent, run: RouterRegistration
    ) -> tuple[int, dict[str, Any]]:
        report: RolloutReport = self._body(event, RolloutReport)
        try:
            response = report.as_response()
        except ValidationError as error:
            raise HttpError(
                400, error.errors(include_url=False)[0]["msg"].removeprefix("Value error, ")
            ) from None
        request_id = report.request_id or report.id
        asked_in = self._fence(run, report.id)
        sent = response if asked_in is None else response.for_nova()
        # Send first, then record: a retried report is deduplicated by SQS on the request id.
        if sent is not None:
            self.sqs.send_message(
                QueueUrl=run.queues[QueueKind.ROLLOUT_RESPONSES],
                MessageBody=dump(sent),
                MessageGroupId=fifo_id(report.id),
                MessageDeduplicationId=fifo_id(request_id),
            )
        else:
            self.counters.unsent_reports += 1
        first = self.store.finish_rollout(
            run.run_id,
            report.id,
            failed=response.aggregate_score is None,
            score=response.aggregate_score,
            now=self.clock(),
        )
        # Kept on its own key, so a retry after a failure above still records it, once; in
        # the phase the forwarder last asked for the sample in.
        self.store.record_report(
            run.run_id,
            request_id,
            episode=Episode.of(record_id_of(report.id), response),
            stage=EvaluationStage(asked_in) if asked_in in set(EvaluationStage) else None,
            now=self.clock(),
        )
        self.counters.reports += 1
        if not first:
            self.counters.duplicate_reports += 1
        return 200, {"id": report.id, "recorded": first, "sent": sent is not None}


def _error(problem: HttpError) -> tuple[int, dict[str, Any]]:
    return problem.status, {
        "error": {"message": problem.message, "type": problem.kind, "code": problem.status}
    }


def proxy_for(environment: Mapping[str, str], clients: Clients) -> Proxy:
    """The proxy of a function with this environment (`RouterSettings`)."""
    settings = RouterSettings.from_environment(environment)
    store = ConversationStore(clients("dynamodb"), settings.table_name)
    return Proxy(store, clients("sqs"), wait_seconds=settings.wait_seconds)


handler = metered_entry("proxy", composed_once(proxy_for, os.environ), os.environ)
