"""`python -m local_trainer`: the local trainer process (the local training cluster's job).

The job comes as JSON in `MTRL_TRAINING_JOB` (domain/trainer_job.py): training, or the
evaluation of a policy (evaluation.py). Training prints one JSON line per step on stdout. Exit
codes: 0 when every step or rollout ran (or after SIGTERM), 1 when it cannot go on, 2 for a job
it cannot read — with one line on stderr saying why.
"""

from __future__ import annotations

import logging
import os
import sys

import boto3

from domain.trainer_job import JobUnreadable, job_from_environment, run_to_the_end
from local_trainer.checkpoints import CheckpointMismatch
from local_trainer.evaluation import Evaluator
from local_trainer.loop import Trainer
from local_trainer.policy import NoLocalPolicy, policy_for
from reward_envs.registry import EnvironmentNotFound, load


def main() -> int:
    # stderr is the run's logs/trainer.log: a line per step, and why it stopped if it did.
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")
    logging.getLogger("mtrl").setLevel(logging.INFO)
    try:
        job = job_from_environment(os.environ)
        policy = policy_for(load(job.config.environment, **job.config.environment_args))
    except (JobUnreadable, NoLocalPolicy, EnvironmentNotFound) as error:
        print(f"trainer: {error}", file=sys.stderr)
        return 2
    sqs, s3 = boto3.client("sqs"), boto3.client("s3")
    try:
        work: Trainer | Evaluator = (
            Evaluator(job, sqs=sqs, s3=s3, policy=policy)
            if job.evaluation
            else Trainer(job, sqs=sqs, s3=s3, policy=policy, out=sys.stdout)
        )
    except CheckpointMismatch as error:
        print(f"trainer: {error}", file=sys.stderr)
        return 1
    return run_to_the_end(work, failures=(CheckpointMismatch,))


if __name__ == "__main__":
    sys.exit(main())
