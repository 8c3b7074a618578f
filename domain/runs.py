"""The run model: a training run's identity, state and bookkeeping (one home for all of it).

A run is one uploaded dataset version: its id derives from bucket, key and version id, so a
duplicate event for the same upload joins the same run, and a new upload of the same key is a
new run. Run ids are valid Step Functions execution names and queue-name parts.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Literal

from botocore.exceptions import ClientError
from pydantic import BaseModel, ConfigDict

from training_configs.schema import TrainingConfig

# A run is active from registration until the pipeline (or the reaper) ends it; where it is in
# between is its execution's state (`mtrl status`), not a copy kept here.
RunStatus = Literal["active", "succeeded", "failed"]
FINISHED: tuple[RunStatus, ...] = ("succeeded", "failed")


def run_id_for(bucket: str, key: str, version_id: str | None) -> str:
    """`<dataset name>-<10 hex>`: readable, unique per (bucket, key, version), <= 64 chars."""
    stem = key.rpartition("/")[2].removesuffix(".jsonl")
    slug = re.sub(r"[^a-z0-9]+", "-", stem.lower())[:40].strip("-") or "dataset"
    digest = hashlib.sha256(f"{bucket}\0{key}\0{version_id or 'unversioned'}".encode()).hexdigest()[
        :10
    ]
    return f"{slug}-{digest}"


def execution_arn(state_machine_arn: str, run_id: str) -> str:
    """The ARN of a run's pipeline execution: executions are named by run id."""
    return f"{state_machine_arn.replace(':stateMachine:', ':execution:')}:{run_id}"


class RunRecord(BaseModel):
    model_config = ConfigDict(frozen=True)

    run_id: str
    bucket: str
    key: str
    version_id: str | None = None
    config_name: str
    status: RunStatus = "active"
    created_at: float
    updated_at: float
    deadline_at: float
    cost_per_hour: float = 0.0
    error: str | None = None
    evaluation: str | None = None  # its held-out evaluation's headline, once it succeeded
    # Run-health warnings that hold (domain/health.py), by metric: Monitor keeps them here.
    health: dict[str, str] = {}
    # What the run did without, said when it ended: a recipe's skipped overrides, a skipped
    # evaluation and why.
    notes: list[str] = []
    config: TrainingConfig | None = None  # what it was registered with (experiment tracking)

    def hours(self, now: float) -> float:
        """How long the run has held compute: from registration to now, or to its last update
        once it finished."""
        until = self.updated_at if self.status in FINISHED else now
        return max(0.0, until - self.created_at) / 3600

    def spent_usd(self, now: float) -> float:
        """Its cost so far, at the full burn its registration estimated (the one rule for it:
        budgets, notices and `mtrl status`/`cost` all read this)."""
        return self.hours(now) * self.cost_per_hour


class RunStore:
    """The runs table: key `run_id`; every write conditional."""

    def __init__(self, dynamodb: Any, table_name: str) -> None:
        self._db = dynamodb
        self._table = table_name

    def register(self, run: RunRecord) -> tuple[RunRecord, bool]:
        """The run as stored, and whether this call created it (False: a duplicate event)."""
        try:
            self._db.put_item(
                TableName=self._table,
                Item={
                    "run_id": {"S": run.run_id},
                    "record": {"S": run.model_dump_json()},
                    "status": {"S": run.status},
                },
                ConditionExpression="attribute_not_exists(run_id)",
            )
            return run, True
        except ClientError as error:
            if error.response["Error"]["Code"] != "ConditionalCheckFailedException":
                raise
        existing = self.get(run.run_id)
        if existing is None:  # deleted in between: register again
            return self.register(run)
        return existing, False

    def get(self, run_id: str) -> RunRecord | None:
        item = self._db.get_item(
            TableName=self._table, Key={"run_id": {"S": run_id}}, ConsistentRead=True
        ).get("Item")
        return RunRecord.model_validate_json(item["record"]["S"]) if item else None

    def update(self, run_id: str, *, now: float, **changes: Any) -> RunRecord:
        """Apply `changes` (status, error, evaluation); fails if the run changed meanwhile."""
        current = self.get(run_id)
        if current is None:
            raise KeyError(f"no run {run_id!r}")
        updated = current.model_copy(update={**changes, "updated_at": now})
        updated = RunRecord.model_validate(json.loads(updated.model_dump_json()))
        self._db.put_item(
            TableName=self._table,
            Item={
                "run_id": {"S": run_id},
                "record": {"S": updated.model_dump_json()},
                "status": {"S": updated.status},
            },
            ConditionExpression="#status = :expected",
            ExpressionAttributeNames={"#status": "status"},
            ExpressionAttributeValues={":expected": {"S": current.status}},
        )
        return updated

    def unfinished(self) -> list[RunRecord]:
        """Runs not yet succeeded or failed (a scan: the table holds runs, not turns)."""
        return [run for run in self.all() if run.status not in FINISHED]

    def all(self) -> list[RunRecord]:
        """Every run, newest first."""
        found = [
            RunRecord.model_validate_json(item["record"]["S"])
            for page in self._db.get_paginator("scan").paginate(TableName=self._table)
            for item in page["Items"]
        ]
        return sorted(found, key=lambda run: run.created_at, reverse=True)
