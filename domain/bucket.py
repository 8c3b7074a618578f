"""The data bucket's layout: where datasets, configs and a run's outputs go (one home for the
prefixes the stacks grant on, the pipeline writes to and the CLI uploads to)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

TRAINING_DATA_PREFIX = "training-data/"  # a .jsonl uploaded here starts a run
CONFIGS_PREFIX = "configs/"  # training configs named by a dataset's metadata
# The dataset object's metadata key (x-amz-meta-mtrl-config) naming its training config.
CONFIG_METADATA_KEY = "mtrl-config"
# A config's `eval_dataset` lives under training_configs.schema.EVALUATION_DATA_PREFIX (the config
# validates it, and training_configs imports nothing of ours).
RUNS_PREFIX = "runs/"  # runs/<run id>/: checkpoints, metrics, summary
SUMMARY_OBJECT = "summary.json"  # under a run's outputs, written by Collect when the run ends
EVALUATION_OBJECT = "evaluation.json"  # under a run's outputs: baseline, final and the delta
# Every finished rollout of a run, Parquet by hour (domain/trajectories.py): under a prefix of
# their own, `trajectories/<run id>/`, where no other output lives (the reward workers write
# here, and nothing a trainer or an evaluation reads back is under it). A local run's outputs
# folder keeps them in a `trajectories/` folder beside its other outputs.
TRAJECTORIES_PREFIX = "trajectories/"
QUERY_RESULTS_PREFIX = "athena-results/"  # the Athena workgroup's results (SQL over them)


# S3's safe characters for key names (Amazon S3 User Guide, "Naming Amazon S3 objects", object
# key naming guidelines: 0-9 a-z A-Z ! - _ . * ' ( ), and / between folders). A dataset's key
# goes as it is into places that read it as more than a name: a Nova recipe's `data_s3_path`,
# which the launcher reads with Hydra/OmegaConf, where `${...}` is an interpolation.
_SAFE_KEY_CHARACTER = re.compile(r"[0-9a-zA-Z!\-_.*'()/]")


class UnsafeKey(ValueError):
    """A dataset key with characters outside S3's safe set; the text names them and the fix."""


def check_dataset_key(key: str) -> None:
    """Refuse a dataset key with a character outside S3's safe set."""
    unsafe = sorted({c for c in key if not _SAFE_KEY_CHARACTER.fullmatch(c)})
    if unsafe:
        shown = " ".join(repr(c) for c in unsafe)
        raise UnsafeKey(
            f"dataset key {key!r} has characters outside S3's safe set ({shown}): rename the file "
            "with letters, digits and ! - _ . * ' ( ) only"
        )


def run_output_prefix(run_id: str) -> str:
    return f"{RUNS_PREFIX}{run_id}/"


def trajectories_prefix(run_id: str) -> str:
    return f"{TRAJECTORIES_PREFIX}{run_id}/"


def run_outputs(s3: Any, *, bucket: str, prefix: str) -> list[str]:
    """Every key under a run's outputs `prefix`, relative to it, sorted (all pages: a run's
    outputs may pass ListObjectsV2's 1,000 keys, AWS's evaluation results among them)."""
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return sorted(
        item["Key"].removeprefix(prefix) for page in pages for item in page.get("Contents", [])
    )


def object_exists(s3: Any, *, bucket: str, key: str) -> bool:
    """Whether `key` is in the bucket, asked by listing its prefix: a GetObject of a missing
    key answers 403 AccessDenied, not 404, to a caller without s3:ListBucket (S3 API reference,
    GetObject), and ListBucket can be granted for one prefix where GetObject's 404 cannot."""
    listed = s3.list_objects_v2(Bucket=bucket, Prefix=key, MaxKeys=1).get("Contents", [])
    return bool(listed) and listed[0]["Key"] == key


class KeyOutsideFolder(ValueError):
    """A key under a downloaded folder whose path is not a plain one below it."""


def download_folder(
    s3: Any, uri: str, folder: Path, *, wanted: Callable[[str], bool] | None = None
) -> Path:
    """The objects under `s3://bucket/prefix/` into `folder`; a LookupError when there are none.
    `wanted`: which of them, by their path under the prefix (default: all).

    S3 keys are literal: `prefix/a/../b` is a key of its own, which a file system resolves to
    `b` (replacing the real one, listed before it) and more `../` to outside `folder`. Every key
    is checked before anything is written; one with a `.`, `..` or empty part, or that still
    resolves outside `folder`, raises KeyOutsideFolder and nothing is downloaded. Folder markers
    (keys ending in `/`) are not files."""
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    prefix = prefix if prefix.endswith("/") or not prefix else f"{prefix}/"
    root = folder.resolve()
    found: list[tuple[str, Path]] = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            relative = item["Key"][len(prefix) :]
            if not relative or relative.endswith("/"):
                continue
            target = (root / relative).resolve()
            parts = relative.split("/")
            if {".", "..", ""} & set(parts) or not target.is_relative_to(root):
                raise KeyOutsideFolder(
                    f"s3://{bucket}/{item['Key']} is not a plain path under s3://{bucket}/"
                    f"{prefix}: nothing was downloaded (a key with '.', '..' or empty parts "
                    "may land elsewhere)"
                )
            found.append((item["Key"], root / relative))
    if not found:
        raise LookupError(f"{uri} holds no files")
    for key, target in found:
        if wanted is not None and not wanted(target.relative_to(root).as_posix()):
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        s3.download_file(bucket, key, str(target))
    return folder
