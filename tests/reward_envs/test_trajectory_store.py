"""The trajectory store: batched Parquet files by hour, every rollout once, bounded memory,
failed uploads kept; and the worker keeping one trajectory per rollout it answers."""

from __future__ import annotations

import io
import json
import threading
from datetime import UTC, datetime, timedelta, timezone

import pandas as pd
import pyarrow.parquet as pq
import pytest

from domain.bucket import trajectories_prefix
from domain.protocol import RolloutRequest, dump
from domain.trajectories import SCHEMA, Trajectory, decode, encode, hour_of, step_windows
from reward_envs.support_desk import load_environment as load_support_desk
from reward_envs.support_desk.notes import oracle_reply
from reward_envs.worker.model_client import CallableModel, ModelTurn, model_turn
from reward_envs.worker.trajectory_store import TrajectoryStore
from tests.reward_envs.test_worker import Queues, eventually, instant, worker_for

PREFIX = trajectories_prefix("run-1")
NOON = datetime(2026, 12, 3, 12, 30, tzinfo=UTC)


class Bucket:
    """Keeps what the store puts; `fail` uploads fail first, `gate` holds uploads."""

    def __init__(self, fail: int = 0, gate: threading.Event | None = None) -> None:
        self.objects: dict[str, bytes] = {}
        self.fail, self.gate = fail, gate
        self.calls = 0

    def put(self, key: str, body: bytes) -> None:
        self.calls += 1
        if self.gate is not None:
            self.gate.wait(timeout=10)
        if self.fail:
            self.fail -= 1
            raise ConnectionError("S3 is away")
        self.objects[key] = body

    def rows(self) -> pd.DataFrame:
        return decode(self.objects.values()).to_pandas()


def trajectory(number: int, *, at: datetime = NOON, words: int = 1) -> Trajectory:
    return Trajectory(
        run_id="run-1",
        sample_id=f"rec{number}_0",
        record_id=f"rec{number}",
        finished_at=at,
        stop_reason="end_of_conversation",
        reward=number / 10,
        turn_rewards=[0.0, number / 10],
        finish_reasons=["stop", "length"],
        policy_version=3,
        messages=[{"role": "user", "content": "guess " * words}, {"role": "assistant"}],
        metrics={"turns": 2.0},
        error=None,
        environment="wordle",
        environment_version="1",
        config_hash="abc",
        writer="w1",
    )


def test_a_full_batch_is_one_parquet_file_under_its_hour() -> None:
    bucket = Bucket()
    store = TrajectoryStore(bucket.put, prefix=PREFIX, writer="w1", flush_rows=3)
    for number in range(3):
        store.add(trajectory(number))
    eventually(lambda: len(bucket.objects) == 1, "the batch's file")
    (key,) = bucket.objects
    assert key == f"{PREFIX}hour=2026-12-03-12/w1-000000.parquet"
    table = pq.read_table(io.BytesIO(bucket.objects[key]))
    assert table.schema.equals(SCHEMA)
    rows = table.to_pylist()
    assert [row["sample_id"] for row in rows] == ["rec0_0", "rec1_0", "rec2_0"]
    assert rows[2]["turn_rewards"] == [0.0, 0.2] and rows[2]["turns"] == 2
    assert rows[2]["truncated_turns"] == 1 and rows[2]["finish_reasons"] == ["stop", "length"]
    assert json.loads(rows[0]["messages"])[0] == {"role": "user", "content": "guess "}
    assert dict(rows[0]["metrics"]) == {"turns": 2.0}
    store.close()


def test_close_uploads_what_waits_and_each_hour_gets_its_file() -> None:
    bucket = Bucket()
    store = TrajectoryStore(bucket.put, prefix=PREFIX, writer="w1", flush_rows=100)
    for number in range(5):
        store.add(trajectory(number, at=NOON + timedelta(minutes=20 * number)))
    assert bucket.objects == {}  # a batch waits for its size or its time
    stats = store.close()
    assert stats.written == 5 and stats.files == 2
    assert sorted(key.split("/")[-2] for key in bucket.objects) == [
        "hour=2026-12-03-12",
        "hour=2026-12-03-13",
    ]
    assert sorted(bucket.rows()["sample_id"]) == [f"rec{n}_0" for n in range(5)]


def test_a_batch_goes_up_after_flush_seconds_however_small() -> None:
    bucket = Bucket()
    store = TrajectoryStore(bucket.put, prefix=PREFIX, writer="w1", flush_seconds=0.05)
    store.add(trajectory(1))
    eventually(lambda: len(bucket.objects) == 1, "the time-flushed file")
    store.close()


def test_a_failed_upload_is_kept_and_sent_again_once() -> None:
    bucket = Bucket(fail=1)
    store = TrajectoryStore(bucket.put, prefix=PREFIX, writer="w1", flush_rows=2)
    for number in range(4):
        store.add(trajectory(number))
    stats = store.close()
    assert stats.failed_uploads == 1 and stats.written == 4 and not bucket.fail
    assert sorted(bucket.rows()["sample_id"]) == [f"rec{n}_0" for n in range(4)]


def test_memory_is_bounded_rollouts_beyond_it_are_counted_as_dropped() -> None:
    gate = threading.Event()  # S3 hangs: nothing leaves the buffer
    bucket = Bucket(gate=gate)
    big = trajectory(0, words=1000).size
    store = TrajectoryStore(
        bucket.put, prefix=PREFIX, writer="w1", flush_rows=1, max_buffered_bytes=3 * big
    )
    store.add(trajectory(0, words=1000))
    eventually(lambda: bucket.calls == 1, "the first upload to start")
    # The bound counts the batch being uploaded too: two more fit beside it.
    kept = [store.add(trajectory(n, words=1000)) for n in range(1, 8)]
    assert kept == [True, True, False, False, False, False, False]
    gate.set()
    stats = store.close()
    assert stats.dropped == 5 and stats.written == 3


def test_rows_parquet_cannot_hold_are_dropped_and_counted_not_retried() -> None:
    bucket = Bucket()
    store = TrajectoryStore(bucket.put, prefix=PREFIX, writer="w1", flush_rows=100)
    bad = Trajectory(**{**trajectory(1).__dict__, "metrics": {"turns": "many"}})
    store.add(bad)
    store.add(trajectory(2, at=NOON + timedelta(hours=1)))  # another hour: its own file
    stats = store.close()
    assert (stats.dropped, stats.written, stats.failed_uploads) == (1, 1, 0)
    assert list(bucket.rows()["sample_id"]) == ["rec2_0"]


def test_step_windows_come_from_the_metrics_lines_of_either_plane() -> None:
    ours = [
        {"step": 1, "started_at": 10.0, "finished_at": 20.0},
        {"step": 2, "started_at": 21.0, "finished_at": 30.0},
        {"step": 2, "started_at": 31.0, "finished_at": 40.0},  # resumed: the step again
        {"step": 3},  # says no time: left out
    ]
    assert step_windows(ours) == {1: (10.0, 20.0), 2: (31.0, 40.0)}
    nova = [{"step": 1, "last_report_at": 5.0}, {"step": 2, "last_report_at": 9.0}]
    assert step_windows(nova) == {1: (None, 5.0), 2: (5.0, 9.0)}


def test_a_completion_says_how_it_ended_and_which_policy_made_it() -> None:
    completion = {
        "policy_version": 7,
        "choices": [{"message": {"content": "hi"}, "finish_reason": "length"}],
    }
    assert model_turn(completion, "s_1") == ModelTurn(
        {"content": "hi", "role": "assistant"}, "length", 7
    )
    bare = {"policy_version": True, "choices": [{"message": {"content": None}}]}
    assert model_turn(bare, "s_1") == ModelTurn({"content": None, "role": "assistant"})


@pytest.mark.parametrize("environment", ["wordle", "support_desk"])
def test_the_worker_keeps_one_trajectory_per_rollout_it_answers(
    queues: Queues, environment: str
) -> None:
    bucket = Bucket()
    store = TrajectoryStore(bucket.put, prefix=PREFIX, writer="w1", flush_rows=4)
    if environment == "wordle":
        env, model = None, instant("[crane]")
        tasks = [{"answer": "crane"}] * 6
    else:
        env, model = load_support_desk(), CallableModel(oracle_reply)
        tasks = [record.metadata for record in env.example_records(6, seed=1)]
    for index, data in enumerate(tasks):
        queues.send(
            f"rec{index}_0", body=dump(RolloutRequest(sample_id=f"rec{index}_0", data=data))
        )
    worker = worker_for(queues, model, **({} if env is None else {"environment": env}))
    worker.settings = worker.settings.model_copy(update={"run_id": "run-1", "config_hash": "c0"})
    worker.trajectories = store
    stats = worker.run(exit_when_idle=True)
    responses = {r.sample_id: r for r in queues.responses_received()}
    rows = bucket.rows().set_index("sample_id")
    assert stats.completed == len(responses) == len(rows) == 6
    for sample, response in responses.items():
        row = rows.loc[sample]
        assert row["reward"] == response.aggregate_score
        assert row["stop_reason"] == response.stop_reason
        assert row["turns"] == len(row["turn_rewards"]) > 0
        assert (row["run_id"], row["config_hash"], row["writer"]) == ("run-1", "c0", "w1")
        assert row["environment"] == environment and row["environment_version"] == "1"
        conversation = json.loads(row["messages"])
        assert sum(m["role"] == "assistant" for m in conversation) == row["turns"]
    if env is not None:  # tool turns are kept as the model wrote them: content null, calls
        conversation = json.loads(rows.iloc[0]["messages"])
        assert any(m.get("tool_calls") and m["content"] is None for m in conversation)
        assert any(m["role"] == "tool" and m["tool_call_id"] for m in conversation)


def test_a_trajectory_that_cannot_be_kept_never_undoes_its_rollout(queues: Queues) -> None:
    """An environment whose messages carry what JSON cannot say is kept as text; a store that
    fails on `add` loses the record, not the answer (sent once, never retried)."""

    class Broken(TrajectoryStore):
        def add(self, trajectory: Trajectory) -> bool:
            raise RuntimeError("disk on fire")

    odd = trajectory(1)
    odd = Trajectory(**{**odd.__dict__, "messages": [{"role": "user", "content": NOON}], "messages_json": ""})  # fmt: skip
    assert json.loads(odd.messages_json) == [{"role": "user", "content": str(NOON)}]
    queues.send("rec0_0")
    worker = worker_for(queues, instant())
    worker.trajectories = Broken(Bucket().put, prefix=PREFIX)
    stats = worker.run(exit_when_idle=True)
    assert (stats.completed, stats.failures) == (1, 0)
    assert len(queues.responses_received()) == 1 and queues.drain(queues.requests) == []


def test_the_file_is_zstd_parquet_of_the_schema_and_an_hour_is_utcs() -> None:
    cut = Trajectory(**{**trajectory(1).__dict__, "finish_reasons": ["stop", "length", "length"]})
    body = encode([cut])
    metadata = pq.ParquetFile(io.BytesIO(body)).metadata
    assert metadata.row_group(0).column(0).compression == "ZSTD"
    assert decode([body]).to_pylist()[0]["truncated_turns"] == 2
    assert decode([]).schema.equals(SCHEMA) and decode([]).num_rows == 0
    paris = datetime(2026, 12, 3, 1, 30, tzinfo=timezone(timedelta(hours=1)))
    assert hour_of(paris) == "2026-12-03-00"
    # Nova's windows: a window opens at its first report.
    assert step_windows([{"step": 1, "first_report_at": 3.0, "last_report_at": 5.0}]) == {
        1: (3.0, 5.0)
    }
