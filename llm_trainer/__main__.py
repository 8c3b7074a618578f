"""`python -m llm_trainer`: the open-weights trainer process (a run's Kubernetes job on
HyperPod; the local training cluster's job with `mtrl local --trainer llm`), or one of several
on a node under `torchrun` (llm_trainer/distributed.py).

The job comes as JSON in `MTRL_TRAINING_JOB` (domain/trainer_job.py): training, or the
evaluation of the starting or trained model. Training prints one JSON line per step on stdout.
Exit codes: 0 when every step or rollout ran (or after SIGTERM), 1 when it cannot go on, 2 for
a job it cannot read or a model it cannot load — with one line on stderr saying why.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from pathlib import Path

import boto3

from domain.trainer_job import JobUnreadable, TrainingFailed, job_from_environment, run_to_the_end
from llm_trainer.hub_token import KEY as HUB_TOKEN
from llm_trainer.hub_token import hub_token
from llm_trainer.model import ModelNotLoaded


def main() -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")
    logging.getLogger("mtrl").setLevel(logging.INFO)
    try:
        job = job_from_environment(os.environ)
    except JobUnreadable as error:
        print(f"trainer: {error}", file=sys.stderr)
        return 2
    if job.hub_token_secret:  # a gated model: its Hub token, before anything downloads it
        try:
            os.environ[HUB_TOKEN] = hub_token(job.hub_token_secret, boto3.client("secretsmanager"))
        except ModelNotLoaded as error:
            print(f"trainer: {error}", file=sys.stderr)
            return 2
    # Imported once the job is read: torch and transformers take seconds to import.
    from llm_trainer.distributed import from_environment
    from llm_trainer.trainer import LlmEvaluator, LlmTrainer
    from llm_trainer.vllm_generator import handover_root

    collective = from_environment()  # started by torchrun: one process of several
    if collective.rank:  # the first process speaks for all on stdout
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - for the process's life

    sqs, s3 = boto3.client("sqs"), boto3.client("s3")
    with (
        tempfile.TemporaryDirectory(prefix="mtrl-trainer-") as scratch,
        tempfile.TemporaryDirectory(prefix="mtrl-adapters-", dir=handover_root()) as adapters,
    ):
        workdir, handover = Path(scratch), Path(adapters)
        try:
            work: LlmTrainer | LlmEvaluator = (
                LlmEvaluator(
                    job, sqs=sqs, s3=s3, workdir=workdir, collective=collective, adapters=handover
                )
                if job.evaluation
                else LlmTrainer(
                    job,
                    sqs=sqs,
                    s3=s3,
                    workdir=workdir,
                    out=sys.stdout,
                    collective=collective,
                    adapters=handover,
                )
            )
        except ModelNotLoaded as error:
            print(f"trainer: {error}", file=sys.stderr)
            return 2
        except (TrainingFailed, LookupError) as error:
            print(f"trainer: {error}", file=sys.stderr)
            return 1
        return run_to_the_end(work)


if __name__ == "__main__":
    sys.exit(main())
