"""The local trainer's loop: GRPO over the rollout protocol's queues.

Per step it draws `global_batch_size / group_size` records, sends `group_size` rollout requests
for each (unique sample ids `<record id>_<n>`), answers the generate requests the router
forwards (a reply and its log-probability, from the current policy), collects the rollout
responses, turns each group's rewards into advantages and updates the policy. Rollouts that
time out or hit an environment error carry no reward: they are left out of their group and
counted. After every step it writes the metrics (and, every few steps, a checkpoint) under the
run's output prefix and prints one JSON line.
"""

from __future__ import annotations

import io
import json
import logging
import threading
import time
import zlib
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, TextIO

import numpy as np
from pydantic import BaseModel, ConfigDict

from domain.backends import METRICS_OBJECT
from domain.dataset import DatasetRecord, read_records
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
    sample_id_for,
)
from domain.run_queues import QueueKind
from mtrl.local.trainer.grpo import Adam, Episode, group_advantages, objective_and_gradient
from mtrl.local.trainer.policy import Decision, Policy
from training_configs.schema import TrainingConfig

log = logging.getLogger("mtrl.trainer")


class TrainingJob(BaseModel):
    """What the training cluster hands the trainer (on HyperPod: the job's settings)."""

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


class TrainingFailed(RuntimeError):
    """The trainer cannot go on; the message says why."""


@dataclass(frozen=True)
class StepMetrics:
    step: int
    mean_reward: float
    max_reward: float
    win_rate: float | None
    zero_variance_groups: float
    turns_per_episode: float
    rollouts: int
    failed_rollouts: int
    objective: float
    kl: float
    clipped_fraction: float
    seconds: float
    params: list[float]


class Trainer:
    def __init__(
        self,
        job: TrainingJob,
        *,
        sqs: Any,
        s3: Any,
        policy: Policy,
        out: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.job, self.sqs, self.s3, self.policy = job, sqs, s3, policy
        self.config = job.config
        self.out = out
        self.clock = clock
        self.params = policy.initial_params()
        self.reference = self.params.copy()
        self.optimizer = Adam(self.config.local_policy.learning_rate)
        self.history: list[StepMetrics] = []
        self._lock = threading.Lock()
        self._decisions: dict[str, dict[str, Decision]] = defaultdict(dict)  # sample -> step
        self._active: set[str] = set()
        self._stop = threading.Event()
        self._answered = 0

    # --- the generate plane: answer the router's generate requests from the current policy ---

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
                params = self.params.copy()
                # A step asked again (a retried request) gets the same reply, counted once.
                decision = self._decisions.get(request.sample_id, {}).get(request.step_id)
            if decision is None:
                rng = np.random.default_rng([self.job.seed, zlib.crc32(request.step_id.encode())])
                decision = self.policy.decide(
                    params, [m.model_dump() for m in request.messages], rng
                )
                with self._lock:
                    if request.sample_id in self._active:
                        self._decisions[request.sample_id][request.step_id] = decision
            response = GenerateResponse(
                sample_id=request.sample_id,
                step_id=request.step_id,
                data={
                    "choices": [
                        Choice(
                            message={"role": "assistant", "content": decision.text},
                            finish_reason="stop",
                            logprobs={
                                "content": [{"token": decision.text, "logprob": decision.logprob}]
                            },
                        )
                    ]
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
            self._answered += len(replies)
        self._delete(self.job.queues[QueueKind.GENERATE_REQUESTS], messages)

    # --- the training loop ---

    def run(self) -> list[StepMetrics]:
        records = self._records()
        answering = threading.Thread(target=self._answer_forever, name="generate", daemon=True)
        answering.start()
        try:
            rng = np.random.default_rng(self.job.seed)
            for step in range(1, self.config.max_steps + 1):
                if self._stop.is_set():
                    break
                self._step(step, records, rng)
        finally:
            self._stop.set()
            answering.join(timeout=5)
        self._save_checkpoint("final")
        log.info("trained %d steps; final checkpoint saved", len(self.history))
        return self.history

    def stop(self) -> None:
        self._stop.set()

    def _records(self) -> list[DatasetRecord]:
        extra = {"VersionId": self.job.dataset_version} if self.job.dataset_version else {}
        body = self.s3.get_object(Bucket=self.job.bucket, Key=self.job.dataset_key, **extra)["Body"]
        records = list(read_records(io.BytesIO(body.read())))
        if not records:
            raise TrainingFailed(f"s3://{self.job.bucket}/{self.job.dataset_key} has no records")
        return records

    def _step(self, step: int, records: list[DatasetRecord], rng: np.random.Generator) -> None:
        started = self.clock()
        group_size = self.config.group_size
        wanted = self.config.global_batch_size // group_size
        chosen = rng.choice(len(records), size=wanted, replace=len(records) < wanted)
        groups: dict[str, list[str]] = {}
        requests = []
        for slot, index in enumerate(chosen):
            record = records[int(index)]
            samples = []
            for k in range(group_size):
                number = ((step - 1) * wanted + slot) * group_size + k
                samples.append(sample_id_for(record.id, number))
            groups[f"{slot}"] = samples
            requests += [
                RolloutRequest(
                    sample_id=sample,
                    max_length=self.config.max_length,
                    rewards=RewardSpec(range=self.job.reward_range),
                    data=record.rollout_data(),
                )
                for sample in samples
            ]
        with self._lock:
            self._active = {request.sample_id for request in requests}
            self._decisions.clear()
        for start in range(0, len(requests), 10):
            self.sqs.send_message_batch(
                QueueUrl=self.job.queues[QueueKind.ROLLOUT_REQUESTS],
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
        responses = self._collect({r.sample_id for r in requests}, started)
        with self._lock:
            decisions = {sample: list(steps.values()) for sample, steps in self._decisions.items()}
            self._active = set()
        self._update(step, groups, responses, decisions, started)

    def _collect(self, samples: set[str], started: float) -> dict[str, RolloutResponse]:
        """Rollout responses for this step's samples, until all are in or the rollouts' time is up."""
        deadline = started + self.config.rollout_timeout_seconds + 30
        url = self.job.queues[QueueKind.ROLLOUT_RESPONSES]
        responses: dict[str, RolloutResponse] = {}
        while len(responses) < len(samples) and self.clock() < deadline and not self._stop.is_set():
            messages = self.sqs.receive_message(
                QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1
            ).get("Messages", [])
            for message in messages:
                try:
                    response = parse(RolloutResponse, message["Body"])
                except ProtocolError as error:
                    log.warning("dropping a malformed rollout response: %s", error)
                    continue
                if response.sample_id in samples:  # late answers of an earlier step are dropped
                    responses[response.sample_id] = response
            if messages:
                self._delete(url, messages)
        if not responses and not self._stop.is_set():
            raise TrainingFailed(
                f"no rollout responses within {self.config.rollout_timeout_seconds + 30} s; "
                "are the reward workers running and reaching the router?"
            )
        return responses

    def _update(
        self,
        step: int,
        groups: dict[str, list[str]],
        responses: dict[str, RolloutResponse],
        decisions: dict[str, list[Decision]],
        started: float,
    ) -> None:
        episodes: list[Episode] = []
        rewards, wins, turns = [], [], []
        flat_groups = 0
        for samples in groups.values():
            scored = [
                (sample, responses[sample].aggregate_score)
                for sample in samples
                if sample in responses and responses[sample].aggregate_score is not None
            ]
            if len(scored) < 2:
                continue
            advantages = group_advantages([score for _, score in scored])
            flat_groups += int(not advantages.any())
            for (sample, score), advantage in zip(scored, advantages, strict=True):
                episodes.append(Episode(decisions.get(sample, []), float(advantage)))
                rewards.append(float(score))
                metrics = {m.name: m.value for m in responses[sample].metrics}
                turns.append(metrics.get("turns", 0.0))
                if "env/won" in metrics:
                    wins.append(metrics["env/won"])
        if not rewards:
            raise TrainingFailed(f"step {step}: no group had two rewarded rollouts")
        settings = self.config.local_policy
        stats = None
        for _ in range(settings.epochs):
            _, gradient, stats = objective_and_gradient(
                self.params,
                episodes,
                clip_ratio=self.config.clip_ratio,
                kl_coefficient=self.config.kl_coefficient,
                reference=self.reference,
            )
            with self._lock:
                self.params = self.optimizer.step(self.params, gradient)
        assert stats is not None
        expected = sum(len(samples) for samples in groups.values())
        metrics = StepMetrics(
            step=step,
            mean_reward=float(np.mean(rewards)),
            max_reward=float(np.max(rewards)),
            win_rate=float(np.mean(wins)) if wins else None,
            zero_variance_groups=flat_groups / max(1, len(groups)),
            turns_per_episode=float(np.mean(turns)),
            rollouts=len(rewards),
            failed_rollouts=expected - len(rewards),
            objective=stats.objective,
            kl=stats.kl,
            clipped_fraction=stats.clipped_fraction,
            seconds=self.clock() - started,
            params=[round(float(p), 4) for p in self.params],
        )
        self.history.append(metrics)
        self._put(
            METRICS_OBJECT,
            "".join(json.dumps(asdict(m)) + "\n" for m in self.history).encode(),
            "application/x-ndjson",
        )
        if step % settings.checkpoint_every == 0:
            self._save_checkpoint(f"step-{step:06d}")
        log.info(
            "step %d/%d: mean reward %.3f, %d rollouts (%d failed), %.1f s",
            step,
            self.config.max_steps,
            metrics.mean_reward,
            metrics.rollouts,
            metrics.failed_rollouts,
            metrics.seconds,
        )
        if self.out is not None:
            print(json.dumps({"event": "step", **asdict(metrics)}), file=self.out, flush=True)

    def _delete(self, url: str, messages: list[dict[str, Any]]) -> None:
        self.sqs.delete_message_batch(
            QueueUrl=url,
            Entries=[
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)
            ],
        )

    def _save_checkpoint(self, name: str) -> None:
        buffer = io.BytesIO()
        np.savez(
            buffer,
            params=self.params,
            feature_names=np.array(self.policy.feature_names),
            step=np.array(len(self.history)),
        )
        self._put(f"checkpoints/{name}.npz", buffer.getvalue(), "application/octet-stream")

    def _put(self, name: str, body: bytes, content_type: str) -> None:
        self.s3.put_object(
            Bucket=self.job.bucket,
            Key=f"{self.job.output_prefix}{name}",
            Body=body,
            ContentType=content_type,
        )
