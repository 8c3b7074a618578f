"""The local trainer's loop: GRPO over the rollout protocol's queues.

Per step it draws `global_batch_size / group_size` records, sends `group_size` rollout requests
for each (unique sample ids `<record id>_<n>`), answers the generate requests the router
forwards (a reply and its log-probability, from the current policy), collects the rollout
responses, turns each group's rewards into advantages and updates the policy. Rollouts that
time out or hit an environment error carry no reward: they are left out of their group and
counted. After every step it writes the metrics (and, every few steps, a checkpoint) under the
run's output prefix and prints one JSON line. Records held out for evaluation are never drawn
(domain/evaluation.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TextIO

import numpy as np

from domain.checkpoints import (
    MANIFEST_OBJECT,
    CheckpointManifest,
    SavedCheckpoint,
    step_checkpoint_name,
)
from domain.dataset import DatasetRecord
from domain.grpo import StepMetrics, score_groups
from domain.trainer_job import (
    PlayedStep,
    TrainingJob,
    earlier_metrics,
    play_step,
    publish_step,
    training_records_of,
)
from local_trainer.checkpoints import (
    FINAL,
    checkpoint_key,
    save_checkpoint,
    starting_policy,
)
from local_trainer.grpo import Adam, Episode, objective_and_gradient
from local_trainer.policy import Decision, Policy
from local_trainer.policy_server import PolicyServer

log = logging.getLogger("mtrl.trainer")


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
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.job, self.sqs, self.s3, self.policy = job, sqs, s3, policy
        self.config = job.config
        self.out = out
        self.clock, self.wall_clock = clock, wall_clock
        # The policy it starts from is also the KL term's reference.
        self.reference, self.steps_before = starting_policy(s3, job, policy)
        self.server = self._generation(self.reference.copy())
        self.optimizer = Adam(self.config.local_policy.learning_rate)
        self.history: list[StepMetrics] = []
        # A run continued from another's checkpoint carries its curve on (its metrics lines).
        self.earlier_metrics = earlier_metrics(s3, job)
        self.manifest = CheckpointManifest(model=self.config.model)

    def _generation(self, params: np.ndarray) -> PolicyServer:
        """What answers the rollouts' turns from the policy being trained: the run's generate
        requests, here."""
        return PolicyServer(
            self.job, sqs=self.sqs, policy=self.policy, params=params, version=self.steps_before
        )

    def _records(self) -> list[DatasetRecord]:
        """What it trains on: the dataset's records but the held-out ones."""
        return training_records_of(self.s3, self.job)

    @property
    def last_step(self) -> int:
        return self.steps_before + len(self.history)

    def run(self) -> list[StepMetrics]:
        records = self._records()
        self.server.start()
        first = self.steps_before + 1
        try:
            rng = np.random.default_rng([self.job.seed, first])
            for step in range(first, first + self.config.max_steps):
                if self.server.stopped:
                    break
                self._step(step, records, rng)
        finally:
            self.server.stop()
        self._save_checkpoint(FINAL)
        log.info("trained %d steps; final checkpoint saved", len(self.history))
        return self.history

    def stop(self) -> None:
        self.server.stop()

    def _step(self, step: int, records: list[DatasetRecord], rng: np.random.Generator) -> None:
        played = play_step(
            self.sqs,
            self.job,
            records,
            step,
            rng,
            record=self.server.record,
            clock=self.clock,
            wall_clock=self.wall_clock,
            stopped=lambda: self.server.stopped,
        )
        self._update(step, played, self.server.recorded(played.samples))

    def _update(
        self,
        step: int,
        played: PlayedStep,
        decisions: dict[str, list[Decision]],
    ) -> None:
        scored, stats = score_groups(played.groups, played.responses)
        episodes = [Episode(decisions.get(r.sample_id, []), r.advantage) for r in scored]
        settings = self.config.local_policy
        update = None
        params = self.server.params
        if not scored:
            log.warning("step %d: no group had two rewarded rollouts; no update", step)
        for _ in range(settings.epochs if scored else 0):
            _, gradient, update = objective_and_gradient(
                params,
                episodes,
                clip_ratio=self.config.clip_ratio,
                kl_coefficient=self.config.kl_coefficient,
                reference=self.reference,
            )
            params = self.optimizer.step(params, gradient)
            self.server.params = params
        self.server.version = step
        metrics = StepMetrics(
            step=step,
            stats=stats,
            update=update,
            seconds=self.clock() - played.started,
            started_at=played.started_at,
            finished_at=self.wall_clock(),
            extra={"params": [round(float(p), 4) for p in params]},
        )
        self.history.append(metrics)
        last = self.steps_before + self.config.max_steps
        self._publish(last=last)
        if step % settings.checkpoint_every == 0:
            self._save_checkpoint(step_checkpoint_name(step))
        log.info(
            "step %d/%d: mean reward %s, %d rollouts (%d failed), %.1f s",
            step,
            last,
            "none" if metrics.mean_reward is None else f"{metrics.mean_reward:.3f}",
            stats.rollouts,
            stats.failed_rollouts,
            metrics.seconds,
        )

    def _publish(self, *, last: int) -> None:
        """The step made known: the run's metrics object, and the progress line on `out`."""
        publish_step(
            self.s3, self.job, earlier=self.earlier_metrics, history=self.history, last=last,
            out=self.out,
        )  # fmt: skip

    def _save_checkpoint(self, name: str) -> None:
        """The policy now, and the run's checkpoint manifest with it."""
        key = checkpoint_key(self.job.output_prefix, name)
        save_checkpoint(
            self.s3,
            bucket=self.job.bucket,
            key=key,
            policy=self.policy,
            params=self.server.params,
            step=self.last_step,
        )
        reward = self.history[-1].mean_reward if self.history else None
        saved = SavedCheckpoint(name=name, key=key, step=self.last_step, mean_reward=reward)
        self.manifest = self.manifest.model_copy(
            update={"checkpoints": [*self.manifest.checkpoints, saved]}
        )
        self._put(
            MANIFEST_OBJECT, self.manifest.model_dump_json(indent=2).encode(), "application/json"
        )

    def _put(self, name: str, body: bytes, content_type: str) -> None:
        self.s3.put_object(
            Bucket=self.job.bucket,
            Key=f"{self.job.output_prefix}{name}",
            Body=body,
            ContentType=content_type,
        )
