"""The open-weights trainer's checkpoints: Hugging Face / PEFT folders under the run's outputs,
`checkpoints/step-<NNNNNN>/` and `checkpoints/final/`, listed with their step and mean reward in
`checkpoints/manifest.json` (domain/checkpoints.py) as the local trainer's are.

A LoRA run saves its adapter (`adapter_config.json`, `adapter_model.safetensors`), a full
fine-tuning run the whole model with its tokenizer: a folder a server loads as it is (a SageMaker
endpoint downloads all of it, mtrl/ops/endpoint.py). Beside it, in `checkpoints/trainer-state/
<name>.pt`, the optimizer's state and the step: what a restarted job needs to go on exactly where
it was (for full fine-tuning, twice the weights). Older step checkpoints are deleted as newer
ones are saved (`grpo.keep_checkpoints`); the final one always stays.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Any

from domain.bucket import download_folder, object_exists
from domain.checkpoints import CHECKPOINTS, MANIFEST_OBJECT, CheckpointManifest, SavedCheckpoint

log = logging.getLogger("mtrl.trainer")
DELETE_BATCH = 1000  # the most keys one DeleteObjects request takes (S3 API reference)
FINAL = "final"
TRAINER_STATE = "trainer-state/"  # under checkpoints/: `<name>.pt` per checkpoint
# A model folder's weights (safetensors; torch's pickles in older ones): what a process that
# receives its shards from the first (llm_trainer/sharding.py) does not download.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


def checkpoint_prefix(output_prefix: str, name: str) -> str:
    return f"{output_prefix}{CHECKPOINTS}{name}/"


def state_key(output_prefix: str, name: str) -> str:
    return f"{output_prefix}{CHECKPOINTS}{TRAINER_STATE}{name}.pt"


def upload_folder(s3: Any, folder: Path, *, bucket: str, prefix: str) -> None:
    """Every file of `folder` under `prefix` (boto3's managed transfer: multipart when large)."""
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            s3.upload_file(str(path), bucket, f"{prefix}{path.relative_to(folder).as_posix()}")


class CheckpointStore:
    """A run's checkpoints: save a folder under a name, list them in the manifest."""

    def __init__(
        self, s3: Any, *, bucket: str, output_prefix: str, model: str, base_model: str | None = None
    ) -> None:
        self.s3, self.bucket, self.output_prefix = s3, bucket, output_prefix
        self.manifest = self._read() or CheckpointManifest(model=model, base_model=base_model)

    def _read(self) -> CheckpointManifest | None:
        key = f"{self.output_prefix}{MANIFEST_OBJECT}"
        if not object_exists(self.s3, bucket=self.bucket, key=key):
            return None
        body = self.s3.get_object(Bucket=self.bucket, Key=key)["Body"].read()
        return CheckpointManifest.model_validate_json(body)

    def latest(self) -> SavedCheckpoint | None:
        """The checkpoint of the highest step this run saved (what a restart resumes from)."""
        saved = self.manifest.checkpoints
        return max(saved, key=lambda checkpoint: checkpoint.step) if saved else None

    def uri(self, checkpoint: SavedCheckpoint) -> str:
        return f"s3://{self.bucket}/{checkpoint.key}"

    def save(
        self,
        folder: Path,
        *,
        name: str,
        step: int,
        mean_reward: float | None,
        state: Path,
        keep: int | None = None,
    ) -> None:
        """The checkpoint `folder` and its trainer `state` file under `name`, listed in the
        manifest; then the step checkpoints older than the newest `keep` deleted (after the
        manifest stops naming them: a crash between leaves nothing listed that is gone)."""
        prefix = checkpoint_prefix(self.output_prefix, name)
        upload_folder(self.s3, folder, bucket=self.bucket, prefix=prefix)
        self.s3.upload_file(str(state), self.bucket, state_key(self.output_prefix, name))
        saved = SavedCheckpoint(name=name, key=prefix, step=step, mean_reward=mean_reward)
        kept = [checkpoint for checkpoint in self.manifest.checkpoints if checkpoint.name != name]
        kept.append(saved)
        steps = sorted((c for c in kept if c.name != FINAL), key=lambda c: c.step, reverse=True)
        pruned = steps[keep:] if keep is not None else []
        kept = [checkpoint for checkpoint in kept if checkpoint not in pruned]
        self.manifest = self.manifest.model_copy(update={"checkpoints": kept})
        self.s3.put_object(
            Bucket=self.bucket,
            Key=f"{self.output_prefix}{MANIFEST_OBJECT}",
            Body=self.manifest.model_dump_json(indent=2).encode(),
            ContentType="application/json",
        )
        log.info("checkpoint %s (step %d) saved to s3://%s/%s", name, step, self.bucket, prefix)
        for old in pruned:
            self._delete(old)

    def _delete(self, checkpoint: SavedCheckpoint) -> None:
        keys = [state_key(self.output_prefix, checkpoint.name)]
        pages = self.s3.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=checkpoint.key
        )
        keys += [item["Key"] for page in pages for item in page.get("Contents", [])]
        for start in range(0, len(keys), DELETE_BATCH):
            answer = self.s3.delete_objects(
                Bucket=self.bucket,
                Delete={"Objects": [{"Key": key} for key in keys[start : start + DELETE_BATCH]],
                        "Quiet": True},
            )  # fmt: skip
            for error in answer.get("Errors", []):  # a checkpoint left over costs storage only
                log.warning("could not delete %s: %s", error.get("Key"), error.get("Message"))
        log.info("checkpoint %s (step %d) deleted", checkpoint.name, checkpoint.step)

    def restore(
        self, checkpoint: SavedCheckpoint, folder: Path, *, weights: bool = True
    ) -> tuple[Path, Path]:
        """The checkpoint's folder and its trainer state file, downloaded under `folder`;
        `weights` False: neither its weights nor the state file (`download_model`)."""
        model = download_model(
            self.s3, self.uri(checkpoint), folder / checkpoint.name, weights=weights
        )
        state = folder / f"{checkpoint.name}.pt"
        if weights:
            self.s3.download_file(
                self.bucket, state_key(self.output_prefix, checkpoint.name), str(state)
            )
        return model, state


def download_model(s3: Any, uri: str, folder: Path, *, weights: bool = True) -> Path:
    """A model folder (a base model, a checkpoint) from S3 into `folder`; `weights` False: all
    but its weights, for a process that reads none (`model.reads_weights`)."""
    return download_folder(s3, uri, folder, wanted=None if weights else _not_weights)


def _not_weights(relative: str) -> bool:
    return not relative.endswith(WEIGHT_SUFFIXES)


def scratch_folder() -> tempfile.TemporaryDirectory[str]:
    return tempfile.TemporaryDirectory(prefix="mtrl-checkpoint-")
