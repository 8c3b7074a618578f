"""A run's checkpoints as outputs of their own, and where a run starts from.

Where a run's checkpoints are recorded:
- a Nova job: `<output_s3_path>/<job>/manifest.json`, whose `checkpoint_s3_bucket` names the
  checkpoint (in AWS's escrow bucket), as the Nova Forge SDK reads it (amzn-nova-forge 1.4.10,
  util/checkpoint_util.py); the step is not said;
- our trainers: `runs/<run_id>/checkpoints/manifest.json` (`CheckpointManifest`), each checkpoint
  with its step and the mean reward then.

Collect lists them all in the run's summary (`Checkpoint`). A config's `base_checkpoint` starts a
run from a previous run's last checkpoint (`run:<run_id>`, for a run of the same model) or from an
S3 URI (iterative training, as Nova Forge offers it).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

RUN_REFERENCE = "run:"  # base_checkpoint: run:<run_id>
CHECKPOINTS = "checkpoints/"  # our trainers' folder of checkpoints, under a run's outputs
MANIFEST_OBJECT = f"{CHECKPOINTS}manifest.json"  # what they saved there
NOVA_MANIFEST = "manifest.json"  # a Nova job's, under `<output_s3_path>/<job>/`


class Checkpoint(BaseModel):
    """One checkpoint a run recorded: `uri` None when its manifest names no location."""

    model_config = ConfigDict(frozen=True)

    name: str
    manifest: str
    uri: str | None
    step: int | None = None
    mean_reward: float | None = None


class SavedCheckpoint(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    key: str
    step: int
    mean_reward: float | None = None


class CheckpointManifest(BaseModel):
    """`checkpoints/manifest.json`: the model a trainer trained and what it saved, in order.
    `base_model`: the weights training started from (a Hugging Face Hub id, a folder or an S3
    URI) — what a LoRA adapter among the checkpoints applies to when it is served."""

    model_config = ConfigDict(frozen=True)

    model: str
    base_model: str | None = None
    checkpoints: list[SavedCheckpoint] = []


class BaseCheckpoint(BaseModel):
    """What a run starts from: `uri`; with `run_id`, the run it continues (its step and curve)."""

    model_config = ConfigDict(frozen=True)

    uri: str
    run_id: str | None = None
    step: int | None = None


def step_checkpoint_name(step: int) -> str:
    """What our trainers call the checkpoint saved after `step` (`step-000010`)."""
    return f"step-{step:06d}"


def referenced_run(reference: str) -> str | None:
    """The run a `base_checkpoint` names (`run:<run_id>`), None for an S3 URI."""
    return reference.removeprefix(RUN_REFERENCE) if reference.startswith(RUN_REFERENCE) else None


def latest(checkpoints: list[Checkpoint]) -> Checkpoint | None:
    """The checkpoint a run ended with: the one of the highest step, else the last recorded,
    among those whose location is known."""
    located = [checkpoint for checkpoint in checkpoints if checkpoint.uri]
    if not located:
        return None
    return max(enumerate(located), key=lambda pair: (pair[1].step or -1, pair[0]))[1]
