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

import json
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, TextIO

import numpy as np

from domain.backends import METRICS_OBJECT
from domain.checkpoints import MANIFEST_OBJECT, CheckpointManifest, SavedCheckpoint
from domain.dataset import DatasetRecord
from domain.episodes import TRUNCATED_METRIC
from domain.evaluation import training_records
from domain.protocol import RolloutResponse, sample_id_for
from mtrl.local.trainer.checkpoints import (
    FINAL,
    checkpoint_key,
    earlier_metrics,
    save_checkpoint,
    starting_policy,
)
from mtrl.local.trainer.exchange import (
    PolicyServer,
    TrainingFailed,
    TrainingJob,
    exchange_rollouts,
    read_dataset,
)
from mtrl.local.trainer.grpo import Adam, Episode, group_advantages, objective_and_gradient
from mtrl.local.trainer.policy import Decision, Policy

log = logging.getLogger("mtrl.trainer")


@dataclass(frozen=True)
class StepMetrics:
    # None: no rollout of the step scored (all failed): nothing learned, the step still counted,
    # for run health (domain/health.py) to judge.
    step: int
    mean_reward: float | None
    max_reward: float | None
    reward_std: float | None  # the spread of the scored rollouts' rewards
    win_rate: float | None
    zero_variance_groups: float | None
    turns_per_episode: float | None
    rollouts: int  # scored ones
    rollouts_asked: int  # what run health divides by (domain/health.py)
    failed_rollouts: int
    env_error_rollouts: int  # of the failed: the environment raised
    timeout_rollouts: int  # of the failed: timed out, or no answer within the step's wait
    truncated_rollouts: int  # answered, with a model turn cut at the token limit
    objective: float | None
    kl: float | None
    clipped_fraction: float | None
    seconds: float
    # Epoch seconds: the step's rollouts finished between the two (`mtrl trajectories --step`).
    started_at: float
    finished_at: float
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
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.job, self.sqs, self.s3, self.policy = job, sqs, s3, policy
        self.config = job.config
        self.out = out
        self.clock, self.wall_clock = clock, wall_clock
        # The policy it starts from is also the KL term's reference.
        self.reference, self.steps_before = starting_policy(s3, job, policy)
        self.server = PolicyServer(
            job, sqs=sqs, policy=policy, params=self.reference.copy(), version=self.steps_before
        )
        self.optimizer = Adam(self.config.local_policy.learning_rate)
        self.history: list[StepMetrics] = []
        # A run continued from another's checkpoint carries its curve on (its metrics lines).
        self.earlier_metrics = earlier_metrics(s3, job)
        self.manifest = CheckpointManifest(model=self.config.model)

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

    def _records(self) -> list[DatasetRecord]:
        """The dataset's records but the ones held out for evaluation."""
        job = self.job
        records = read_dataset(
            self.s3, bucket=job.bucket, key=job.dataset_key, version=job.dataset_version
        )
        kept = training_records(records, self.config)
        if not kept:
            raise TrainingFailed(
                f"all {len(records)} records of s3://{job.bucket}/{job.dataset_key} are held out "
                f"for evaluation (eval_fraction {self.config.held_out_fraction}); add records or "
                "lower eval_fraction"
            )
        log.info("training on %d records, %d held out", len(kept), len(records) - len(kept))
        return kept

    def _step(self, step: int, records: list[DatasetRecord], rng: np.random.Generator) -> None:
        started, started_at = self.clock(), self.wall_clock()
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
            requests += [self.job.rollout_request(record, sample) for sample in samples]
        self.server.record(request.sample_id for request in requests)
        responses, waited = exchange_rollouts(
            self.sqs,
            self.job,
            requests,
            started=started,
            clock=self.clock,
            stopped=lambda: self.server.stopped,
        )
        if not responses and not self.server.stopped:
            raise TrainingFailed(
                f"no rollout responses within {waited} s; "
                "are the reward workers running and reaching the router?"
            )
        decisions = self.server.recorded()
        self._update(step, groups, responses, decisions, (started, started_at))

    def _update(
        self,
        step: int,
        groups: dict[str, list[str]],
        responses: dict[str, RolloutResponse],
        decisions: dict[str, list[Decision]],
        started: tuple[float, float],  # (clock, wall clock)
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
                succeeded = responses[sample].succeeded  # the environment's success flag
                if succeeded is not None:
                    wins.append(float(succeeded))
        settings = self.config.local_policy
        stats = None
        params = self.server.params
        if not rewards:
            log.warning("step %d: no group had two rewarded rollouts; no update", step)
        for _ in range(settings.epochs if rewards else 0):
            _, gradient, stats = objective_and_gradient(
                params,
                episodes,
                clip_ratio=self.config.clip_ratio,
                kl_coefficient=self.config.kl_coefficient,
                reference=self.reference,
            )
            params = self.optimizer.step(params, gradient)
            self.server.params = params
        self.server.version = step
        asked = [sample for samples in groups.values() for sample in samples]
        expected = len(asked)
        ended = [responses[sample].stop_reason for sample in asked if sample in responses]
        metrics = StepMetrics(
            step=step,
            mean_reward=float(np.mean(rewards)) if rewards else None,
            max_reward=float(np.max(rewards)) if rewards else None,
            reward_std=float(np.std(rewards)) if rewards else None,
            win_rate=float(np.mean(wins)) if wins else None,
            zero_variance_groups=flat_groups / len(groups) if rewards else None,
            turns_per_episode=float(np.mean(turns)) if rewards else None,
            rollouts=len(rewards),
            rollouts_asked=expected,
            failed_rollouts=expected - len(rewards),
            env_error_rollouts=ended.count("env_error"),
            timeout_rollouts=ended.count("timeout") + expected - len(ended),
            truncated_rollouts=sum(
                1 for sample in asked if sample in responses and _truncated(responses[sample])
            ),
            objective=stats.objective if stats else None,
            kl=stats.kl if stats else None,
            clipped_fraction=stats.clipped_fraction if stats else None,
            seconds=self.clock() - started[0],
            started_at=started[1],
            finished_at=self.wall_clock(),
            params=[round(float(p), 4) for p in params],
        )
        self.history.append(metrics)
        lines = self.earlier_metrics + [json.dumps(asdict(m)) for m in self.history]
        self._put(
            METRICS_OBJECT, "".join(line + "\n" for line in lines).encode(), "application/x-ndjson"
        )
        if step % settings.checkpoint_every == 0:
            self._save_checkpoint(f"step-{step:06d}")
        last = self.steps_before + self.config.max_steps
        log.info(
            "step %d/%d: mean reward %s, %d rollouts (%d failed), %.1f s",
            step,
            last,
            "none" if metrics.mean_reward is None else f"{metrics.mean_reward:.3f}",
            metrics.rollouts,
            metrics.failed_rollouts,
            metrics.seconds,
        )
        if self.out is not None:
            line = {"event": "step", **asdict(metrics), "of": last}
            print(json.dumps(line), file=self.out, flush=True)

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


def _truncated(response: RolloutResponse) -> bool:
    return any(m.name == TRUNCATED_METRIC and m.value > 0 for m in response.metrics)
