"""The run model: run ids (the execution's name), a run's hours and spend, and the runs table's
conditional writes — registration that joins duplicates, updates that refuse a changed run."""

from __future__ import annotations

import hashlib
import string
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from hypothesis import example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from domain.runs import RunRecord, RunStore, execution_arn, run_id_for
from tests.aws import Recorded, create_runs_table

BUCKET = "data-bucket"
HOUR = 3600.0

# StartExecution's `name` (botocore's stepfunctions model): the run id names the execution.
EXECUTION_NAME = (
    boto3.client("stepfunctions", region_name="us-east-1")
    .meta.service_model.operation_model("StartExecution")
    .input_shape.members["name"]
    .metadata
)
KEY_CHARACTERS = string.ascii_letters + string.digits + " -_.üß€"


def test_run_ids_are_stable_per_upload_and_new_per_version() -> None:
    first = run_id_for(BUCKET, "training-data/My Wordle set.jsonl", "v1")
    assert first == run_id_for(BUCKET, "training-data/My Wordle set.jsonl", "v1")
    assert first != run_id_for(BUCKET, "training-data/My Wordle set.jsonl", "v2")
    assert first != run_id_for(BUCKET, "training-data/My Wordle set.jsonl", None)
    # The digest is of bucket, key and version, apart: ids of runs already made stay theirs.
    for version, named in (("v1", "v1"), (None, "unversioned")):
        digest = hashlib.sha256(f"{BUCKET}\0training-data/My Wordle set.jsonl\0{named}".encode())
        assert run_id_for(BUCKET, "training-data/My Wordle set.jsonl", version) == (
            f"my-wordle-set-{digest.hexdigest()[:10]}"
        )


def test_a_run_ids_name_part_is_the_datasets_file_name_made_safe() -> None:
    def name(key: str) -> str:
        return run_id_for(BUCKET, key, None).rsplit("-", 1)[0]

    assert name("training-data/team-a/Q3 Games (v2).jsonl") == "q3-games-v2"
    assert name("training-data/--Wordle--.jsonl") == "wordle"
    assert name("training-data/ü ß/..jsonl") == "dataset"
    assert name(f"training-data/{'a' * 39}-{'b' * 20}.jsonl") == "a" * 39  # 40 then stripped
    assert name(f"training-data/{'c' * 60}.jsonl") == "c" * 40


@settings(max_examples=60, deadline=None)
@example(key=f"training-data/{'Wordle games ' * 20}.jsonl", version="v1")  # a long name
@given(
    key=st.text(KEY_CHARACTERS, min_size=1, max_size=300).map(
        lambda name: f"training-data/{name}.jsonl"
    ),
    version=st.none() | st.text(min_size=1, max_size=40),
)
def test_any_upload_gets_an_execution_name_unique_per_bucket(key: str, version: str | None) -> None:
    """Whatever the key, the id is a valid execution name and at most 64 characters (so queue
    names stay readable); the same key and version in another bucket is another run."""
    run_id = run_id_for(BUCKET, key, version)
    assert EXECUTION_NAME["min"] <= len(run_id) <= min(64, EXECUTION_NAME["max"])
    assert all(c.isascii() and (c.isalnum() or c == "-") for c in run_id)
    assert run_id != run_id_for(f"{BUCKET}-2", key, version)


def test_a_runs_execution_is_named_by_its_run_id() -> None:
    machine = "arn:aws:states:us-east-1:123456789012:stateMachine:nova-mtrl-pipeline"
    assert execution_arn(machine, "wordle-1a2b") == (
        "arn:aws:states:us-east-1:123456789012:execution:nova-mtrl-pipeline:wordle-1a2b"
    )


def _run(run_id: str = "r-1", **changes: Any) -> RunRecord:
    fields = {
        "run_id": run_id,
        "bucket": BUCKET,
        "key": "training-data/x.jsonl",
        "version_id": "v1",
        "config_name": "rft_multiturn_lora",
        "created_at": 1.0,
        "updated_at": 1.0,
        "deadline_at": 100.0,
    }
    return RunRecord(**{**fields, **changes})


def test_a_run_holds_compute_until_it_finishes_and_costs_its_hours_at_its_burn() -> None:
    active = _run(created_at=HOUR, updated_at=HOUR, cost_per_hour=400.0)
    assert (active.hours(now=3 * HOUR), active.spent_usd(now=3 * HOUR)) == (2.0, 800.0)
    assert active.hours(now=0.0) == 0.0  # a clock behind the registration
    for status in ("succeeded", "failed"):
        done = active.model_copy(update={"status": status, "updated_at": 4 * HOUR})
        assert (done.hours(now=50 * HOUR), done.spent_usd(now=50 * HOUR)) == (3.0, 1_200.0)
    assert _run(created_at=0.0).spent_usd(now=HOUR) == 0.0  # no estimate, no spend


@pytest.fixture
def store(aws: None) -> RunStore:
    db = boto3.client("dynamodb")
    create_runs_table(db, "runs")
    return RunStore(Recorded(db), "runs")


def test_a_duplicate_event_joins_the_registered_run(store: RunStore) -> None:
    record, created = store.register(_run())
    assert created and record == _run()
    again, created_again = store.register(_run(created_at=5.0))
    assert (again, created_again) == (_run(), False)
    reads = store._db.sent("get_item")
    assert reads and all(params["ConsistentRead"] for params in reads)


def test_a_run_deleted_between_the_refusal_and_the_read_is_registered_again(aws: None) -> None:
    db = boto3.client("dynamodb")
    create_runs_table(db, "runs")
    store = RunStore(db, "runs")
    store.register(_run())
    real_get = db.get_item

    def deleted_meanwhile(**kwargs: Any) -> dict:
        db.delete_item(TableName="runs", Key={"run_id": {"S": "r-1"}})
        db.get_item = real_get
        return real_get(**kwargs)

    db.get_item = deleted_meanwhile
    assert store.register(_run(created_at=5.0)) == (_run(created_at=5.0), True)
    assert store.get("r-1") == _run(created_at=5.0)


def test_registering_in_a_missing_table_is_an_error_not_a_duplicate(aws: None) -> None:
    with pytest.raises(ClientError, match="ResourceNotFoundException"):
        RunStore(boto3.client("dynamodb"), "no-such-table").register(_run())


def test_an_update_changes_the_run_and_its_status_key_once(store: RunStore) -> None:
    store.register(_run())
    updated = store.update("r-1", now=2.0, status="failed", error="stopped")
    assert updated == _run(status="failed", error="stopped", updated_at=2.0)
    assert store.get("r-1") == updated
    item = store._db.get_item(TableName="runs", Key={"run_id": {"S": "r-1"}})["Item"]
    assert item["status"] == {"S": "failed"}
    with pytest.raises(KeyError, match="no run 'nope'"):
        store.update("nope", now=1.0, status="failed")
    with pytest.raises(ValidationError, match="status"):
        store.update("r-1", now=3.0, status="paused")


def test_an_update_refuses_a_run_whose_status_changed_meanwhile(store: RunStore) -> None:
    store.register(_run())
    stale = store.get
    store.get = lambda run_id: stale(run_id).model_copy(update={"status": "succeeded"})
    with pytest.raises(ClientError, match="ConditionalCheckFailed"):
        store.update("r-1", now=2.0, status="failed")
    store.get = stale
    assert store.get("r-1").status == "active"


def test_unfinished_runs_are_the_active_ones_and_all_are_newest_first(store: RunStore) -> None:
    for run_id, created in (("old", 1.0), ("new", 3.0), ("mid", 2.0)):
        store.register(_run(run_id, created_at=created))
    store.update("mid", now=4.0, status="succeeded")
    store.update("old", now=4.0, status="failed")
    assert [run.run_id for run in store.all()] == ["new", "mid", "old"]
    assert [run.run_id for run in store.unfinished()] == ["new"]
