"""`mtrl trajectories`: a local run's kept rollouts, selected by step, rank or sample, printed
as a table and conversations, or as JSON; clear errors when there is nothing to show."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner

from domain.bucket import TRAJECTORIES_PREFIX
from domain.trajectories import Trajectory
from mtrl.cli import app
from reward_envs.worker.trajectory_store import TrajectoryStore

RUN = "wordle-0123456789"
START = datetime(2026, 12, 3, 9, 0, tzinfo=UTC).timestamp()


def kept(number: int, *, reward: float | None, at: float) -> Trajectory:
    return Trajectory(
        run_id=RUN,
        sample_id=f"rec{number}_0",
        record_id=f"rec{number}",
        finished_at=datetime.fromtimestamp(at, UTC),
        stop_reason="end_of_conversation" if reward is not None else "env_error",
        reward=reward,
        turn_rewards=[] if reward is None else [0.1, reward - 0.1],
        finish_reasons=["stop", "length"],
        policy_version=number // 2,
        messages=[
            {"role": "user", "content": f"secret number {number}"},
            {"role": "assistant", "content": "[crane]"},
            {"role": "user", "content": "c r a n e: 🟩⬛⬛⬛⬛"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "c1", "function": {"name": "finish", "arguments": "{}"}}],
            },
        ],
        metrics={"turns": 2.0},
        error=None if reward is not None else "step 1: KeyError: 'x'",
        environment="wordle",
        environment_version="1",
        config_hash="c0ffee",
        writer="w1",
    )


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    """A local run's outputs: 4 rollouts in each of 2 steps, one of them failed."""
    outputs = tmp_path / RUN / "outputs"
    folder = outputs / TRAJECTORIES_PREFIX

    def put(key: str, body: bytes) -> None:
        path = folder / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body)

    store = TrajectoryStore(put, prefix="", writer="w1", flush_rows=3)
    rewards = [0.2, 0.9, None, 0.5, 0.7, 0.3, 1.0, 0.4]
    for number, reward in enumerate(rewards):
        store.add(kept(number, reward=reward, at=START + 10 * number + 5))
    assert store.close().written == 8
    steps = [{"step": 1, "started_at": START, "finished_at": START + 40}, {"step": 2, "started_at": START + 41, "finished_at": START + 80}]  # fmt: skip
    (outputs / "metrics.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
    return tmp_path


def mtrl(runs: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["trajectories", RUN, "--out", str(runs), *args])
    return result.exit_code, result.output


def test_the_table_lists_every_trajectory_of_the_run(runs: Path) -> None:
    code, output = mtrl(runs, "--no-conversations")
    assert code == 0, output
    assert f"run {RUN}: 8 of 8 trajectories" in output
    assert all(f"rec{n}_0" in output for n in range(8))
    assert "secret number" not in output


def test_worst_puts_a_failed_rollout_first_and_shows_its_conversation(runs: Path) -> None:
    code, output = mtrl(runs, "--worst", "2")
    assert code == 0, output
    assert "2 of 8 trajectories" in output
    assert output.index("rec2_0") < output.index("rec0_0")  # failed, then 0.2
    assert "secret number 2" in output and "KeyError" in output
    assert "→ finish({})" in output and "turn reward +0.100" in output


def test_best_and_step_select_by_reward_and_by_when_rollouts_finished(runs: Path) -> None:
    code, output = mtrl(runs, "--step", "2", "--best", "1", "--json")
    assert code == 0, output
    (row,) = [json.loads(line) for line in output.splitlines() if line.strip()]
    assert (row["sample_id"], row["reward"], row["policy_version"]) == ("rec6_0", 1.0, 3)
    assert row["messages"][0]["content"] == "secret number 6" and row["metrics"] == {"turns": 2.0}
    code, output = mtrl(runs, "--step", "1", "--json")
    step_one = [json.loads(line)["sample_id"] for line in output.splitlines() if line.strip()]
    assert step_one == ["rec0_0", "rec1_0", "rec2_0", "rec3_0"]


def test_one_sample_by_its_id(runs: Path) -> None:
    code, output = mtrl(runs, "--sample", "rec5_0")
    assert code == 0 and "1 of 8" in output and "secret number 5" in output


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (("--sample", "nope_0"), 1, "has no trajectory of sample 'nope_0'"),
        (("--step", "9"), 1, "has no step 9 in its metrics (steps 1..2)"),
        (("--worst", "1", "--best", "1"), 2, "--worst and --best pick opposite ends"),
    ],
)
def test_what_cannot_be_shown_is_one_line_and_a_non_zero_exit(
    runs: Path, args: tuple[str, ...], code: int, message: str
) -> None:
    exit_code, output = mtrl(runs, *args)
    assert exit_code == code and message in output and "Traceback" not in output


def test_a_run_that_kept_none_says_why(tmp_path: Path) -> None:
    (tmp_path / RUN / "outputs").mkdir(parents=True)
    exit_code, output = mtrl(tmp_path)
    assert exit_code == 1 and "kept no trajectories" in output and "trajectories: true" in output
