"""The pipeline's rules for stopping and reaping runs, as pure functions of (the run, what was
seen, now) — including the cases that cost money when wrong: an execution stopped by hand,
failed or timed out must still have its run torn down."""

from __future__ import annotations

import pytest

from domain.backends import JobStatus, Phase
from domain.run_state import JobReport
from domain.runs import RunRecord
from lambdas.pipeline.policies import must_stop, quiet_polls, reaping, stalled, unscored

HOUR = 3600.0
RUN = RunRecord(
    run_id="wordle-1", bucket="b", key="training-data/w.jsonl", config_name="c",
    created_at=0.0, updated_at=0.0, deadline_at=10 * HOUR, cost_per_hour=400.0,
)  # fmt: skip


def test_a_run_within_its_deadline_and_budget_goes_on() -> None:
    assert must_stop(RUN, budget_usd=4_000, now=5 * HOUR) is None
    assert must_stop(RUN, budget_usd=4_000, now=10 * HOUR) is None  # the deadline itself


def test_past_its_deadline_or_over_budget_it_stops_saying_why() -> None:
    late = must_stop(RUN, budget_usd=1e9, now=10 * HOUR + 1)
    assert late is not None and late.phase == Phase.PAST_DEADLINE
    spent = must_stop(RUN, budget_usd=1_000, now=3 * HOUR)  # $1,200 at $400/h
    assert spent is not None and spent.phase == Phase.OVER_BUDGET
    assert spent.reason == "run wordle-1 spent about $1,200, over its budget"
    assert must_stop(RUN, budget_usd=1_200, now=3 * HOUR) is None  # at the budget, not over


def test_quiet_polls_count_only_a_running_step_that_stands_still() -> None:
    running = JobStatus(Phase.RUNNING, step=7)
    seen = lambda step: JobReport(phase=Phase.RUNNING, step=step, quiet_polls=4)  # noqa: E731
    assert quiet_polls(running, seen(7)) == 5
    assert quiet_polls(running, seen(6)) == 0
    assert quiet_polls(JobStatus(Phase.PENDING, step=7), seen(7)) == 0
    assert quiet_polls(JobStatus(Phase.RUNNING), seen(None)) == 0
    assert quiet_polls(running, None) == 0  # the first poll has nothing to compare


@pytest.mark.parametrize(
    ("rollout_seconds", "poll_seconds", "threshold"),
    # three rollouts' time, in whole polls (100 s x 3 = 6.7 polls of 45 s: 7); at least three
    [(600, 60, 30), (100, 45, 7), (10, 60, 3), (600, 0, 1800)],
)
def test_stalled_after_three_rollouts_time_and_never_before_three_polls(
    rollout_seconds: int, poll_seconds: int, threshold: int
) -> None:
    status = JobStatus(Phase.RUNNING, step=12)
    kwargs = {"rollout_timeout_seconds": rollout_seconds, "poll_seconds": poll_seconds}
    assert stalled(status, threshold - 1, **kwargs) is None
    verdict = stalled(status, threshold, **kwargs)
    assert verdict is not None and verdict.phase == Phase.STALLED
    assert verdict.reason == (
        f"no training progress past step 12 for {threshold} polls; check the run's queue ages"
    )


@pytest.mark.parametrize("status", ["SUCCEEDED", "FAILED", "TIMED_OUT", "ABORTED", "MISSING"])
def test_a_run_whose_execution_no_longer_runs_is_reaped_whatever_ended_it(status: str) -> None:
    decided = reaping(execution_status=status, deadline_at=10 * HOUR, now=HOUR, asked_for=False)
    assert decided is not None
    assert (decided.reason, decided.stop_with) == (f"its execution is {status}", None)


def test_a_running_execution_is_left_alone_until_its_deadline() -> None:
    assert reaping(execution_status="RUNNING", deadline_at=HOUR, now=HOUR, asked_for=False) is None
    late = reaping(execution_status="RUNNING", deadline_at=HOUR, now=HOUR + 1, asked_for=False)
    assert late is not None
    assert (late.reason, late.stop_with) == ("past its deadline", "DeadlinePassed")


@pytest.mark.parametrize(("status", "stop_with"), [("RUNNING", "StoppedByUser"), ("ABORTED", None)])
def test_a_teardown_asked_for_is_done_whatever_the_state(
    status: str, stop_with: str | None
) -> None:
    decided = reaping(execution_status=status, deadline_at=10 * HOUR, now=HOUR, asked_for=True)
    assert decided is not None
    assert (decided.reason, decided.stop_with) == (
        "torn down on request (mtrl teardown)",
        stop_with,
    )


def test_cost_so_far_runs_to_now_then_stops_when_the_run_finishes() -> None:
    """One rule for budgets, notices and `mtrl status`/`cost`: full burn from registration to
    now, frozen at the last update once the run finished, never negative."""
    assert RUN.hours(now=2 * HOUR) == 2 and RUN.spent_usd(now=2 * HOUR) == 800
    done = RUN.model_copy(update={"status": "succeeded", "updated_at": 3 * HOUR})
    assert done.spent_usd(now=50 * HOUR) == 1_200
    assert RUN.spent_usd(now=-HOUR) == 0  # a clock behind the registration


def _step(asked: int, failed: int, errors: int = 0, timeouts: int = 0) -> dict:
    return {
        "step": 1, "rollouts_asked": asked, "failed_rollouts": failed,
        "env_error_rollouts": errors, "timeout_rollouts": timeouts,
    }  # fmt: skip


def test_a_job_that_succeeded_without_one_scored_rollout_fails_the_run() -> None:
    """Two steps, every rollout failed: shorter than any health rule's window, so only this
    rule sees it; one scored rollout is enough to let the run succeed."""
    done = JobStatus(Phase.SUCCEEDED)
    failed_all = [_step(64, 64, errors=40, timeouts=24), _step(64, 64, errors=64)]
    verdict = unscored(done, failed_all)
    assert verdict is not None and verdict.phase == Phase.FAILED
    assert verdict.reason == (
        "the job ended without one scored rollout: all 128 failed (104 environment errors, 24 "
        "timeouts), so nothing was trained on; see the workers' logs"
    )
    told = [failed_all[0], {**failed_all[1], "step": 2, "first_error": "reset: KeyError: 'x'"}]
    assert unscored(done, told).reason.endswith(  # type: ignore[union-attr]
        "so nothing was trained on; the first (training step 2): reset: KeyError: 'x'"
    )
    assert unscored(done, [*failed_all, _step(64, 63)]) is None
    assert unscored(JobStatus(Phase.RUNNING), failed_all) is None  # the health rules' part
    assert unscored(done, []) is None  # no metrics: nothing to judge by
