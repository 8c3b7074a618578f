"""The local trainer's side of the rollout protocol, shared by training and evaluation: the
policy server (answers the router's generate requests from the current parameters), sending
rollout requests and collecting their responses, and reading the run's dataset."""

from __future__ import annotations

import logging
import threading
import zlib
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict

from domain.checkpoints import BaseCheckpoint
from domain.dataset import DatasetRecord, read_dataset_object
from domain.episodes import EvaluationStage
from domain.protocol import (
    Choice,
    GenerateRequest,
    GenerateResponse,
    ProtocolError,
    RewardSpec,
    RolloutRequest,
    RolloutResponse,
    dump,
    fifo_id,
    parse,
)
from domain.run_queues import QueueKind
from mtrl.local.trainer.policy import Decision, Policy
from training_configs.schema import TrainingConfig

log = logging.getLogger("mtrl.trainer")
# Rollouts' time to come back, beyond the config's rollout timeout: the workers' queue polls.
COLLECT_SLACK_SECONDS = 30


class TrainingJob(BaseModel):
    """What the training cluster hands the trainer (on HyperPod: the job's settings): training,
    or with `evaluation` the evaluation of the starting (baseline) or trained (final) policy."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    bucket: str
    dataset_key: str
    dataset_version: str | None = None
    output_prefix: str
    queues: dict[str, str]
    config: TrainingConfig
    reward_range: tuple[float, float] = (0.0, 1.0)
    seed: int = 0
    evaluation: EvaluationStage | None = None
    base: BaseCheckpoint | None = None  # the checkpoint training starts from

    def rollout_request(self, record: DatasetRecord, sample_id: str) -> RolloutRequest:
        """The rollout request of one sample of `record`, for training or evaluation alike."""
        return RolloutRequest(
            sample_id=sample_id,
            max_length=self.config.max_length,
            rewards=RewardSpec(range=self.reward_range),
            data=record.rollout_data(),
        )


class TrainingFailed(RuntimeError):
    """The trainer cannot go on; the message says why."""


def read_dataset(s3: Any, *, bucket: str, key: str, version: str | None) -> list[DatasetRecord]:
    records = read_dataset_object(s3, bucket=bucket, key=key, version=version)
    if not records:
        raise TrainingFailed(f"s3://{bucket}/{key} has no records")
    return records


class PolicyServer:
    """Answers generate requests with the policy at `params` until stopped. The decisions taken
    for the samples being recorded (`record`) are kept for the update that follows. Each answer
    says which `version` of the policy made it (the updates it has had)."""

    def __init__(
        self, job: TrainingJob, *, sqs: Any, policy: Policy, params: np.ndarray, version: int = 0
    ) -> None:
        self.job, self.sqs, self.policy = job, sqs, policy
        self._params = params
        self.version = version
        self._lock = threading.Lock()
        self._decisions: dict[str, dict[str, Decision]] = defaultdict(dict)  # sample -> step
        self._recorded: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._answer_forever, name="generate", daemon=True)
        self.answered = 0

    @property
    def params(self) -> np.ndarray:
        with self._lock:
            return self._params.copy()

    @params.setter
    def params(self, value: np.ndarray) -> None:
        with self._lock:
            self._params = value

    def record(self, samples: Iterable[str]) -> None:
        """Keep the decisions of these samples from now on (and only theirs)."""
        with self._lock:
            self._recorded = set(samples)
            self._decisions.clear()

    def recorded(self) -> dict[str, list[Decision]]:
        """The decisions kept since `record`, per sample in turn order; stops keeping them."""
        with self._lock:
            decisions = {sample: list(steps.values()) for sample, steps in self._decisions.items()}
            self._recorded = set()
        return decisions

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def _answer_forever(self) -> None:
        url = self.job.queues[QueueKind.GENERATE_REQUESTS]
        while not self._stop.is_set():
            try:
                messages = self.sqs.receive_message(
                    QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1
                ).get("Messages", [])
                if messages:
                    self._answer(messages)
            except Exception:  # noqa: BLE001 - a poll failure must not end the generate plane
                if self._stop.is_set():
                    return
                log.exception("answering generate requests failed; retrying")
                self._stop.wait(0.5)

    def _answer(self, messages: list[dict[str, Any]]) -> None:
        replies = []
        for message in messages:
            try:
                request = parse(GenerateRequest, message["Body"])
            except ProtocolError as error:
                log.warning("dropping a malformed generate request: %s", error)
                continue
            with self._lock:
                params = self._params.copy()
                # A step asked again (a retried request) gets the same reply, counted once.
                decision = self._decisions.get(request.sample_id, {}).get(request.step_id)
            if decision is None:
                rng = np.random.default_rng([self.job.seed, zlib.crc32(request.step_id.encode())])
                decision = self.policy.decide(
                    params, [m.model_dump() for m in request.messages], rng
                )
                with self._lock:
                    if request.sample_id in self._recorded:
                        self._decisions[request.sample_id][request.step_id] = decision
            response = GenerateResponse(
                sample_id=request.sample_id,
                step_id=request.step_id,
                data={
                    "choices": [
                        Choice(
                            message=decision.message,
                            finish_reason="stop",
                            logprobs={
                                "content": [{"token": decision.text, "logprob": decision.logprob}]
                            },
                        )
                    ],
                    "policy_version": self.version,
                },
                finish_reason="stop",
            )
            replies.append(
                {
                    "Id": str(len(replies)),
                    "MessageBody": dump(response),
                    "MessageGroupId": fifo_id(request.sample_id),
                    "MessageDeduplicationId": fifo_id(request.step_id),
                }
            )
        if replies:
            self.sqs.send_message_batch(
                QueueUrl=self.job.queues[QueueKind.GENERATE_RESPONSES], Entries=replies
            )
            self.answered += len(replies)
        delete_messages(self.sqs, self.job.queues[QueueKind.GENERATE_REQUESTS], messages)


def send_rollouts(sqs: Any, url: str, requests: list[RolloutRequest]) -> None:
    for start in range(0, len(requests), 10):
        sqs.send_message_batch(
            QueueUrl=url,
            Entries=[
                {
                    "Id": str(i),
                    "MessageBody": dump(request),
                    "MessageGroupId": fifo_id(request.sample_id),
                    "MessageDeduplicationId": fifo_id(request.sample_id),
                }
                for i, request in enumerate(requests[start : start + 10])
            ],
        )


def collect_rollouts(
    sqs: Any,
    url: str,
    samples: set[str],
    *,
    deadline: float,
    clock: Callable[[], float],
    stopped: Callable[[], bool],
) -> dict[str, RolloutResponse]:
    """Rollout responses of `samples`, until all are in, the deadline passes or the job stops.
    Answers of other samples (late ones of an earlier batch) are dropped."""
    responses: dict[str, RolloutResponse] = {}
    while len(responses) < len(samples) and clock() < deadline and not stopped():
        messages = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1).get(
            "Messages", []
        )
        for message in messages:
            try:
                response = parse(RolloutResponse, message["Body"])
            except ProtocolError as error:
                log.warning("dropping a malformed rollout response: %s", error)
                continue
            if response.sample_id in samples:
                responses[response.sample_id] = response
        if messages:
            delete_messages(sqs, url, messages)
    return responses


def exchange_rollouts(
    sqs: Any,
    job: TrainingJob,
    requests: list[RolloutRequest],
    *,
    started: float,
    clock: Callable[[], float],
    stopped: Callable[[], bool],
) -> tuple[dict[str, RolloutResponse], float]:
    """Send `requests` to the run's workers and collect their responses for up to the rollout
    timeout (and the queues' slack) from `started`: the responses, and that wait in seconds."""
    send_rollouts(sqs, job.queues[QueueKind.ROLLOUT_REQUESTS], requests)
    waited = job.config.rollout_timeout_seconds + COLLECT_SLACK_SECONDS
    responses = collect_rollouts(
        sqs,
        job.queues[QueueKind.ROLLOUT_RESPONSES],
        {request.sample_id for request in requests},
        deadline=started + waited,
        clock=clock,
        stopped=stopped,
    )
    return responses, waited


def delete_messages(sqs: Any, url: str, messages: list[dict[str, Any]]) -> None:
    sqs.delete_message_batch(
        QueueUrl=url,
        Entries=[
            {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)
        ],
    )
