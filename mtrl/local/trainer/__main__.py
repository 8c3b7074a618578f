"""`python -m mtrl.local.trainer`: the local trainer process (the local training cluster's job).

The job comes as JSON in `MTRL_TRAINING_JOB` (see loop.TrainingJob). Prints one JSON line per
training step on stdout. Exit codes: 0 when every step ran (or after SIGTERM), 1 when training
cannot go on, 2 for a job it cannot read — with one line on stderr saying why.
"""

from __future__ import annotations

import logging
import os
import signal
import sys

import boto3
from pydantic import ValidationError

from mtrl.local.trainer.loop import Trainer, TrainingFailed, TrainingJob
from mtrl.local.trainer.policy import NoLocalPolicy, policy_for


def main() -> int:
    # stderr is the run's logs/trainer.log: a line per step, and why it stopped if it did.
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")
    logging.getLogger("mtrl").setLevel(logging.INFO)
    try:
        job = TrainingJob.model_validate_json(os.environ.get("MTRL_TRAINING_JOB", ""))
        policy = policy_for(job.config.environment)
    except ValidationError as error:
        problem = error.errors(include_url=False)[0]
        where = ".".join(str(part) for part in problem["loc"]) or "job"
        print(f"trainer: MTRL_TRAINING_JOB: {where}: {problem['msg']}", file=sys.stderr)
        return 2
    except NoLocalPolicy as error:
        print(f"trainer: {error}", file=sys.stderr)
        return 2
    trainer = Trainer(
        job, sqs=boto3.client("sqs"), s3=boto3.client("s3"), policy=policy, out=sys.stdout
    )
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: trainer.stop())
    try:
        trainer.run()
    except TrainingFailed as error:
        print(f"trainer: {error}", file=sys.stderr)
        return 1
    print('{"event": "done"}', flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
