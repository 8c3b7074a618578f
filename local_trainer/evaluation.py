"""The local trainer's evaluation job: the policy training starts from (baseline: its base
checkpoint, or the policy that knows nothing) or the one training saved last (final) answers the
generate requests while the run's held-out records are played (domain/trainer_job.py
`play_evaluation`) — sampled as in training, nothing learned."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from domain.episodes import Episode, EvaluationStage
from domain.trainer_job import TrainingJob, play_evaluation
from local_trainer.checkpoints import (
    FINAL,
    checkpoint_key,
    load_checkpoint,
    starting_policy,
)
from local_trainer.policy import Policy
from local_trainer.policy_server import PolicyServer


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

    def run(self) -> list[Episode]:
        self.server.start()
        try:
            return play_evaluation(
                self.s3, self.sqs, self.job, clock=self.clock, stopped=lambda: self.server.stopped
            )
        finally:
            self.server.stop()

    def stop(self) -> None:
        self.server.stop()
