"""The local policy's checkpoints under the run's outputs: `checkpoints/<name>.npz`, holding the
parameters, the names of the features they weigh and the training step they were saved at (the
run's `checkpoints/manifest.json` lists them, domain/checkpoints.py); and where a trainer
starts from: the policy that knows nothing, or a base checkpoint."""

from __future__ import annotations

import io
from typing import Any

import numpy as np

from domain.checkpoints import CHECKPOINTS
from domain.trainer_job import TrainingJob
from local_trainer.policy import Policy

FINAL = "final"  # the policy training ended with


def checkpoint_key(output_prefix: str, name: str) -> str:
    return f"{output_prefix}{CHECKPOINTS}{name}.npz"


def save_checkpoint(
    s3: Any, *, bucket: str, key: str, policy: Policy, params: np.ndarray, step: int
) -> None:
    buffer = io.BytesIO()
    np.savez(
        buffer, params=params, feature_names=np.array(policy.feature_names), step=np.array(step)
    )
    s3.put_object(
        Bucket=bucket, Key=key, Body=buffer.getvalue(), ContentType="application/octet-stream"
    )


class CheckpointMismatch(ValueError):
    """A checkpoint of another policy (other features) than the one asked to load it."""


def starting_policy(s3: Any, job: TrainingJob, policy: Policy) -> tuple[np.ndarray, int]:
    """The parameters a run starts from and the steps trained before: its base checkpoint's, or
    the policy that knows nothing at step 0."""
    if job.base is None:
        return policy.initial_params(), 0
    bucket, _, key = job.base.uri.removeprefix("s3://").partition("/")
    return load_checkpoint(s3, bucket=bucket, key=key, policy=policy)


def load_checkpoint(s3: Any, *, bucket: str, key: str, policy: Policy) -> tuple[np.ndarray, int]:
    """The parameters and step of a checkpoint of `policy`."""
    body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    with np.load(io.BytesIO(body)) as saved:
        names = tuple(str(name) for name in saved["feature_names"])
        if names != tuple(policy.feature_names):
            raise CheckpointMismatch(
                f"s3://{bucket}/{key} weighs features {names}, not this policy's "
                f"{tuple(policy.feature_names)}"
            )
        return saved["params"].astype(float), int(saved["step"])
