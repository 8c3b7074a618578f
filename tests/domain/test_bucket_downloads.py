"""Downloading an S3 folder (a checkpoint, a base model, the Forge CLI bundle) writes only inside
the folder it is downloaded into: S3 keys are literal, so `a/../b` is a key of its own, which
would land on `b` (replacing the real one, listed before it) or, with more `../`, outside."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import boto3
import pytest

from domain.bucket import KeyOutsideFolder, download_folder

BUCKET = "data"
FINAL = "runs/victim/checkpoints/final/"


@pytest.fixture
def s3(aws: None) -> Any:
    client = boto3.client("s3")
    client.create_bucket(Bucket=BUCKET)
    client.put_object(Bucket=BUCKET, Key=f"{FINAL}adapter_config.json", Body=b"{}")
    client.put_object(Bucket=BUCKET, Key=f"{FINAL}adapter_model.safetensors", Body=b"real")
    return client


def test_a_checkpoint_downloads_whole(s3: Any, tmp_path: Path) -> None:
    folder = download_folder(s3, f"s3://{BUCKET}/{FINAL}", tmp_path / "final")
    assert (folder / "adapter_model.safetensors").read_bytes() == b"real"
    assert sorted(p.name for p in folder.iterdir()) == [
        "adapter_config.json", "adapter_model.safetensors",
    ]  # fmt: skip


@pytest.mark.parametrize(
    "planted",
    [
        # What the workers' trajectory grant (runs/*/trajectories/*) let through: lands on the
        # real adapter, which it lists after.
        "trajectories/../adapter_model.safetensors",
        "../../../../outside.py",  # beside the folder: /scratch's caches, HF_HOME
        "./adapter_model.safetensors",
        "sub//adapter_model.safetensors",
    ],
)
def test_a_key_that_is_not_a_plain_path_under_the_folder_downloads_nothing(
    s3: Any, tmp_path: Path, planted: str
) -> None:
    s3.put_object(Bucket=BUCKET, Key=f"{FINAL}{planted}", Body=b"poisoned")
    with pytest.raises(KeyOutsideFolder) as refused:
        download_folder(s3, f"s3://{BUCKET}/{FINAL}", tmp_path / "scratch" / "final")
    assert str(refused.value) == (
        f"s3://{BUCKET}/{FINAL}{planted} is not a plain path under s3://{BUCKET}/{FINAL}: "
        "nothing was downloaded (a key with '.', '..' or empty parts may land elsewhere)"
    )
    assert not any(path.is_file() for path in tmp_path.rglob("*"))


def test_only_the_wanted_files_download(s3: Any, tmp_path: Path) -> None:
    folder = download_folder(
        s3, f"s3://{BUCKET}/{FINAL}", tmp_path / "final",
        wanted=lambda relative: not relative.endswith(".safetensors"),
    )  # fmt: skip
    assert [p.name for p in folder.iterdir()] == ["adapter_config.json"]
