"""`mtrl trajectories`: a run's kept rollouts, read from a local run's folder or the data bucket,
and the ones asked for (a step, the worst or best, one sample)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from domain.backends import METRICS_OBJECT
from domain.bucket import (
    TRAJECTORIES_PREFIX,
    object_exists,
    run_output_prefix,
    run_outputs,
    trajectories_prefix,
)
from domain.step_metrics import metrics_lines
from domain.trajectories import decode, step_windows


class NoTrajectories(LookupError):
    """Nothing to show; the message says why and what to do."""


@dataclass(frozen=True)
class RunTrajectories:
    run_id: str
    where: str  # a folder or an s3:// prefix, for messages
    rows: list[dict[str, Any]]  # in the order they finished
    metrics: list[dict[str, Any]]  # the run's metrics lines (for --step)


def from_folder(run_id: str, outputs: Path) -> RunTrajectories:
    """A local run's (`mtrl local` saves its outputs under DIR/<run_id>/outputs/)."""
    folder = outputs / TRAJECTORIES_PREFIX
    files = sorted(folder.rglob("*.parquet"))
    metrics = outputs / METRICS_OBJECT
    return _run(
        run_id,
        str(folder),
        (path.read_bytes() for path in files),
        metrics.read_text() if metrics.is_file() else "",
    )


def from_bucket(s3: Any, *, bucket: str, run_id: str) -> RunTrajectories:
    """A deployed run's, under trajectories/<run_id>/ in the data bucket (its metrics under
    runs/<run_id>/)."""
    prefix = trajectories_prefix(run_id)
    files = [
        key for key in run_outputs(s3, bucket=bucket, prefix=prefix) if key.endswith(".parquet")
    ]

    def body(key: str) -> bytes:
        return s3.get_object(Bucket=bucket, Key=key)["Body"].read()

    metrics_key = f"{run_output_prefix(run_id)}{METRICS_OBJECT}"
    has_metrics = object_exists(s3, bucket=bucket, key=metrics_key)
    metrics = body(metrics_key).decode() if has_metrics else ""
    return _run(
        run_id, f"s3://{bucket}/{prefix}", (body(f"{prefix}{key}") for key in files), metrics
    )


def _run(run_id: str, where: str, files: Iterable[bytes], metrics: str) -> RunTrajectories:
    rows = sorted(decode(files).to_pylist(), key=lambda row: row["finished_at"])
    if not rows:
        raise NoTrajectories(
            f"run {run_id} kept no trajectories at {where} (a run keeps them when its config "
            "has `trajectories: true`, the default; a run still starting has none yet)"
        )
    return RunTrajectories(run_id, where, rows, metrics_lines(metrics))


def select(
    run: RunTrajectories,
    *,
    step: int | None = None,
    worst: int | None = None,
    best: int | None = None,
    sample: str | None = None,
) -> list[dict[str, Any]]:
    """The rows asked for: one sample's, or a step's (by when its rollouts finished), then the
    `worst` or `best` by episode reward (a failed rollout, with none, counts as the worst)."""
    rows = run.rows
    if sample is not None:
        rows = [row for row in rows if row["sample_id"] == sample]
        if not rows:
            raise NoTrajectories(
                f"run {run.run_id} has no trajectory of sample {sample!r}; "
                f"`mtrl trajectories {run.run_id}` lists them"
            )
    if step is not None:
        windows = step_windows(run.metrics)
        if step not in windows:
            known = f"steps {min(windows)}..{max(windows)}" if windows else "no step yet"
            raise NoTrajectories(f"run {run.run_id} has no step {step} in its metrics ({known})")
        began, ended = windows[step]
        rows = [
            row
            for row in rows
            if (began is None or row["finished_at"].timestamp() >= began)
            and row["finished_at"].timestamp() <= ended
        ]
    if worst is not None or best is not None:
        ranked = sorted(rows, key=_reward, reverse=best is not None)
        rows = ranked[: worst if worst is not None else best]
    return rows


def _reward(row: dict[str, Any]) -> float:
    return -math.inf if row["reward"] is None else row["reward"]
