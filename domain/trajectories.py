"""The trajectory store's one schema: every finished rollout as a row of Parquet under
`trajectories/<run_id>/hour=<YYYY-MM-DD-HH>/<writer>-<n>.parquet` in the data bucket.

Hive-style hour folders, so Athena (the Glue table's partition projection), DuckDB, pyarrow and
pandas read the folder as one table. The reward workers write it (reward_envs/worker/
trajectory_store.py), `mtrl trajectories` reads it. Only the writer and the readers import this
module: it needs pyarrow, which the Lambdas do not carry.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from domain.step_metrics import number

HOUR_FORMAT = "%Y-%m-%d-%H"  # Athena's projection reads it as yyyy-MM-dd-HH

SCHEMA = pa.schema(
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("sample_id", pa.string(), nullable=False),
        pa.field("record_id", pa.string(), nullable=False),
        pa.field("finished_at", pa.timestamp("ms", tz="UTC"), nullable=False),
        pa.field("stop_reason", pa.string(), nullable=False),
        pa.field("reward", pa.float64()),  # the episode's aggregate; null when it failed
        pa.field("turn_rewards", pa.list_(pa.float64()), nullable=False),
        pa.field("turns", pa.int32(), nullable=False),
        # Per assistant turn, how generation ended ("length": cut at max tokens).
        pa.field("finish_reasons", pa.list_(pa.string()), nullable=False),
        pa.field("truncated_turns", pa.int32(), nullable=False),
        # The oldest weights that answered a turn (updates applied), when the trainer says.
        pa.field("policy_version", pa.int64()),
        # The conversation as the model saw and wrote it: OpenAI chat messages, as JSON.
        pa.field("messages", pa.string(), nullable=False),
        pa.field("metrics", pa.map_(pa.string(), pa.float64()), nullable=False),
        pa.field("error", pa.string()),
        pa.field("environment", pa.string(), nullable=False),
        pa.field("environment_version", pa.string()),
        pa.field("config_hash", pa.string()),
        pa.field("writer", pa.string(), nullable=False),
    ]
)


@dataclass(frozen=True)
class Trajectory:
    """One finished rollout, as the store keeps it."""

    run_id: str
    sample_id: str
    record_id: str
    finished_at: datetime
    stop_reason: str
    reward: float | None
    turn_rewards: list[float]
    finish_reasons: list[str | None]
    policy_version: int | None
    messages: list[dict[str, Any]]
    metrics: dict[str, float]
    error: str | None
    environment: str
    environment_version: str | None
    config_hash: str | None
    writer: str  # the store that wrote it (a worker)
    messages_json: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        # Serialised once, where the rollout ends: what the writer's memory bound counts.
        if not self.messages_json:  # what JSON cannot say (an environment's object) as its text
            object.__setattr__(self, "messages_json", json.dumps(self.messages, default=str))

    @property
    def size(self) -> int:
        """Roughly the bytes it holds while buffered."""
        return len(self.messages_json) + 64 * len(self.metrics) + 256

    def row(self) -> dict[str, Any]:
        row = asdict(self)
        row["messages"] = row.pop("messages_json")
        row["metrics"] = list(self.metrics.items())
        row["turns"] = len(self.turn_rewards)
        row["truncated_turns"] = sum(reason == "length" for reason in self.finish_reasons)
        return row


def hour_of(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime(HOUR_FORMAT)


def object_key(prefix: str, hour: str, writer: str, number: int) -> str:
    """Where a writer's `number`th file of an hour goes under a run's `prefix`
    (domain.bucket.trajectories_prefix)."""
    return f"{prefix}hour={hour}/{writer}-{number:06d}.parquet"


def encode(trajectories: Sequence[Trajectory]) -> bytes:
    """One Parquet file (zstd) of `trajectories`."""
    table = pa.Table.from_pylist([t.row() for t in trajectories], schema=SCHEMA)
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd")
    return sink.getvalue()


def decode(files: Iterable[bytes]) -> pa.Table:
    """The rows of Parquet files written by `encode`, as one table (empty when none)."""
    tables = [pq.read_table(io.BytesIO(body), schema=SCHEMA) for body in files]
    return pa.concat_tables(tables) if tables else SCHEMA.empty_table()


def step_windows(metrics: Sequence[dict[str, Any]]) -> dict[int, tuple[float | None, float]]:
    """Training step -> (from, to) in epoch seconds, both inclusive: the rollouts that finished
    in that window are the step's. A metrics line says when its step's rollouts began and ended
    (`started_at`/`finished_at` from our trainers, `first_report_at`/`last_report_at` from the
    router's windows of a Nova run); without a start, the window opens where the previous one
    closed (None: open). A line without an end is left out; a step written twice (a resumed
    run) keeps its last line."""
    windows: dict[int, tuple[float | None, float]] = {}
    previous: float | None = None
    for line in metrics:
        ended = number(line.get("finished_at", line.get("last_report_at")))
        if ended is None or not isinstance(line.get("step"), int):
            continue
        began = number(line.get("started_at", line.get("first_report_at")))
        windows[line["step"]] = (previous if began is None else began, ended)
        previous = ended
    return windows
