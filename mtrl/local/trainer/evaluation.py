"""The local trainer's evaluation job: the policy training starts from (baseline: its base
checkpoint, or the policy that knows nothing) or the one training saved last (final) plays the run's held-out records through the same queues, router and reward workers
as training — `eval_samples` rollouts per record, sampled as in training, nothing learned — and
the episodes go, one JSON line each, to the run's `evaluation/<stage>.jsonl`."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from domain.dataset import DatasetRecord
from domain.episodes import Episode, EvaluationStage
from domain.evaluation import (
    evaluation_records,
    evaluation_sample_id,
    evaluation_source,
    write_episodes,
)
from mtrl.local.trainer.checkpoints import (
    FINAL,
    checkpoint_key,
    load_checkpoint,
    starting_policy,
)
from mtrl.local.trainer.exchange import PolicyServer, TrainingJob, exchange_rollouts, read_dataset
from mtrl.local.trainer.policy import Policy

log = logging.getLogger("mtrl.trainer")


class Evaluator:
    def __init__(
        self,
        job: TrainingJob,
        *,
        sqs: Any,
        s3: Any,
        policy: Policy,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if job.evaluation is None:
            raise ValueError(f"run {job.run_id}: the job is not an evaluation")
        self.job, self.stage = job, job.evaluation
        self.sqs, self.s3, self.policy, self.clock = sqs, s3, policy, clock
        params, version = self._policy()
        self.server = PolicyServer(job, sqs=sqs, policy=policy, params=params, version=version)

    def _policy(self) -> tuple[np.ndarray, int]:
        """The parameters evaluated and their version (the steps they were trained)."""
        if self.stage is EvaluationStage.BASELINE:
            return starting_policy(self.s3, self.job, self.policy)
        return load_checkpoint(
            self.s3,
            bucket=self.job.bucket,
            key=checkpoint_key(self.job.output_prefix, FINAL),
            policy=self.policy,
        )

    def records(self) -> list[DatasetRecord]:
        job, config = self.job, self.job.config
        key, version = evaluation_source(config, job.dataset_key, job.dataset_version)
        records = read_dataset(self.s3, bucket=job.bucket, key=key, version=version)
        return evaluation_records(records, config, named_file=config.eval_dataset is not None)

    def run(self) -> list[Episode]:
        """Play every evaluation rollout, a training step's worth at a time; write the episodes."""
        config = self.job.config
        records = self.records()
        planned = [
            (record, evaluation_sample_id(record.id, self.stage, number, config.eval_samples))
            for record in records
            for number in range(config.eval_samples)
        ]
        episodes: list[Episode] = []
        self.server.start()
        try:
            for start in range(0, len(planned), config.global_batch_size):
                if self.server.stopped:
                    break
                episodes += self._batch(planned[start : start + config.global_batch_size])
        finally:
            self.server.stop()
        write_episodes(
            self.s3, bucket=self.job.bucket, output_prefix=self.job.output_prefix,
            stage=self.stage, episodes=episodes,
        )  # fmt: skip
        log.info(
            "%s evaluation: %d rollouts of %d records", self.stage, len(episodes), len(records)
        )
        return episodes

    def stop(self) -> None:
        self.server.stop()

    def _batch(self, planned: list[tuple[DatasetRecord, str]]) -> list[Episode]:
        started = self.clock()
        requests = [self.job.rollout_request(record, sample) for record, sample in planned]
        responses, waited = exchange_rollouts(
            self.sqs,
            self.job,
            requests,
            started=started,
            clock=self.clock,
            stopped=lambda: self.server.stopped,
        )
        return [
            Episode.of(record.id, responses[sample])
            if sample in responses
            else Episode.unanswered(record.id, sample, waited)
            for record, sample in planned
        ]
