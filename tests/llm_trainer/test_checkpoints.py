"""The open-weights trainer's checkpoint store: a servable folder per checkpoint, the trainer's
state beside it, the manifest, and older step checkpoints deleted as newer ones come (against
moto's S3)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import boto3
import pytest

from domain.checkpoints import CheckpointManifest
from llm_trainer.checkpoints import FINAL, CheckpointStore, download_model

BUCKET, PREFIX = "data", "runs/r/"


@pytest.fixture
def s3(aws: None) -> Any:
    client = boto3.client("s3")
    client.create_bucket(Bucket=BUCKET)
    return client


def _keys(s3: Any) -> set[str]:
    listed = s3.list_objects_v2(Bucket=BUCKET, Prefix=f"{PREFIX}checkpoints/")
    return {item["Key"].removeprefix(f"{PREFIX}checkpoints/") for item in listed["Contents"]}


def _save(store: CheckpointStore, tmp: Path, name: str, step: int, keep: int | None) -> None:
    folder = tmp / name
    folder.mkdir()
    (folder / "adapter_config.json").write_text(f'{{"step": {step}}}')
    (folder / "adapter_model.safetensors").write_bytes(bytes([step]) * 8)
    state = tmp / f"{name}.state"
    state.write_bytes(b"optimizer")
    store.save(folder, name=name, step=step, mean_reward=step / 10, state=state, keep=keep)


def test_older_step_checkpoints_go_as_newer_ones_come_and_the_final_one_stays(
    s3: Any, tmp_path: Path
) -> None:
    store = CheckpointStore(s3, bucket=BUCKET, output_prefix=PREFIX, model="qwen3-8b",
                            base_model="Qwen/Qwen3-8B")  # fmt: skip
    for step in (1, 2, 3, 4):
        _save(store, tmp_path, f"step-{step:06d}", step, keep=2)
    _save(store, tmp_path, FINAL, 4, keep=2)
    manifest = CheckpointManifest.model_validate_json(
        s3.get_object(Bucket=BUCKET, Key=f"{PREFIX}checkpoints/manifest.json")["Body"].read()
    )
    assert [(c.name, c.step) for c in manifest.checkpoints] == [
        ("step-000003", 3), ("step-000004", 4), ("final", 4),
    ]  # fmt: skip
    assert manifest.base_model == "Qwen/Qwen3-8B"
    assert _keys(s3) == {
        "manifest.json",
        *(f"{name}/{file}" for name in ("step-000003", "step-000004", "final")
          for file in ("adapter_config.json", "adapter_model.safetensors")),
        "trainer-state/step-000003.pt", "trainer-state/step-000004.pt", "trainer-state/final.pt",
    }  # fmt: skip
    # A restart finds the newest and gets back both halves of it.
    latest = store.latest()
    assert latest is not None and latest.step == 4
    folder, state = store.restore(latest, tmp_path / "restored")
    assert sorted(p.name for p in folder.iterdir()) == [
        "adapter_config.json", "adapter_model.safetensors",
    ]  # fmt: skip
    assert state.read_bytes() == b"optimizer"


def test_without_a_bound_every_checkpoint_stays(s3: Any, tmp_path: Path) -> None:
    store = CheckpointStore(s3, bucket=BUCKET, output_prefix=PREFIX, model="tiny")
    for step in (1, 2, 3):
        _save(store, tmp_path, f"step-{step:06d}", step, keep=None)
    assert [c.step for c in store.manifest.checkpoints] == [1, 2, 3]
    assert {key for key in _keys(s3) if key.startswith("trainer-state/")} == {
        f"trainer-state/step-{step:06d}.pt" for step in (1, 2, 3)
    }


def test_a_process_that_reads_no_weights_downloads_none(s3: Any, tmp_path: Path) -> None:
    """Several processes sharding a full fine-tune: only the first reads the weights and the
    optimizer's state (llm_trainer/sharding.py), so the others download neither."""
    store = CheckpointStore(s3, bucket=BUCKET, output_prefix=PREFIX, model="tiny")
    folder = tmp_path / "step-000001"
    folder.mkdir()
    for name in ("config.json", "model-00001-of-00002.safetensors", "model.safetensors.index.json",
                 "tokenizer.json", "pytorch_model.bin", "generation_config.json"):  # fmt: skip
        (folder / name).write_text(name)
    (tmp_path / "state").write_bytes(b"optimizer")
    store.save(folder, name="step-000001", step=1, mean_reward=0.0, state=tmp_path / "state")
    latest = store.latest()
    assert latest is not None
    model, state = store.restore(latest, tmp_path / "second", weights=False)
    assert sorted(p.name for p in model.iterdir()) == [
        "config.json", "generation_config.json", "model.safetensors.index.json", "tokenizer.json",
    ]  # fmt: skip
    assert not state.exists()
    whole, state = store.restore(latest, tmp_path / "first")
    assert len(list(whole.iterdir())) == 6 and state.read_bytes() == b"optimizer"
    base = download_model(s3, store.uri(latest), tmp_path / "base", weights=False)
    assert sorted(p.name for p in base.iterdir()) == sorted(p.name for p in model.iterdir())
