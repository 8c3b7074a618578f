"""When the pipeline stops a run or tears it down: pure rules of (the run, what was seen, now),
which Monitor and the reaper apply (lambdas/pipeline/compute.py, handlers.py)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from domain.backends import JobStatus, Phase
from domain.health import Finding
from domain.run_state import JobReport
from domain.runs import RunRecord
from domain.step_metrics import first_step_error


@dataclass(frozen=True)
class Verdict:
    phase: Phase
    reason: str


def must_stop(run: RunRecord, *, budget_usd: float, now: float) -> Verdict | None:
    """Past its deadline, or its cost so far over budget."""
    if now > run.deadline_at:
        return Verdict(Phase.PAST_DEADLINE, f"run {run.run_id} passed its deadline")
    spent = run.spent_usd(now)
    if spent > budget_usd:
        return Verdict(
            Phase.OVER_BUDGET, f"run {run.run_id} spent about ${spent:,.0f}, over its budget"
        )
    return None


def quiet_polls(status: JobStatus, previous: JobReport | None) -> int:
    """Polls in a row the running job's training step has not moved (0 when it moved)."""
    if previous is None:
        return 0
    unchanged = (
        status.phase == Phase.RUNNING and status.step is not None and status.step == previous.step
    )
    return previous.quiet_polls + 1 if unchanged else 0


def stalled(
    status: JobStatus, quiet: int, *, rollout_timeout_seconds: int, poll_seconds: int
) -> Verdict | None:
    """Stalled: the step stood still for as long as three rollouts may take (three polls at
    least), so a slow step is not mistaken for a dead one."""
    if quiet >= max(3, math.ceil(3 * rollout_timeout_seconds / max(1, poll_seconds))):
        return Verdict(
            Phase.STALLED,
            f"no training progress past step {status.step} for {quiet} polls; check the run's "
            "queue ages",
        )
    return None


def unscored(status: JobStatus, lines: Sequence[Mapping[str, Any]]) -> Verdict | None:
    """A job that succeeded without one scored rollout in the steps its metrics show (their
    recent tail): every rollout failed, so nothing was trained on. The run fails saying so, never
    SUCCEEDED — whatever the run-health rules' windows, which a short run may never fill."""
    if status.phase != Phase.SUCCEEDED:
        return None
    asked, failed = _total(lines, "rollouts_asked"), _total(lines, "failed_rollouts")
    if asked == 0 or failed < asked:
        return None
    errors, timeouts = _total(lines, "env_error_rollouts"), _total(lines, "timeout_rollouts")
    first = first_step_error(lines)
    why = f"the first (training step {first[0]}): {first[1]}" if first else "see the workers' logs"
    return Verdict(
        Phase.FAILED,
        f"the job ended without one scored rollout: all {asked} failed ({errors} environment "
        f"errors, {timeouts} timeouts), so nothing was trained on; {why}",
    )


def _total(lines: Sequence[Mapping[str, Any]], key: str) -> int:
    return sum(line[key] for line in lines if isinstance(line.get(key), int))


def unhealthy(status: JobStatus, found: Sequence[Finding]) -> Verdict | None:
    """A running job one of whose run-health rules with action `stop` holds (the first)."""
    stopping = [finding for finding in found if finding.stops]
    if status.phase != Phase.RUNNING or not stopping:
        return None
    return Verdict(Phase.UNHEALTHY, stopping[0].reason())


@dataclass(frozen=True)
class Reaping:
    reason: str
    stop_with: str | None = None  # the error a running execution is stopped with


def reaping(
    *, execution_status: str, deadline_at: float, now: float, asked_for: bool
) -> Reaping | None:
    """Whether the reaper tears a run down: asked for (`mtrl teardown`), whatever its state; a
    running execution past the run's deadline; or an execution that no longer runs — stopped by
    hand, failed, timed out or gone ("MISSING") — whose run is not finished. None: leave it."""
    running = execution_status == "RUNNING"
    if asked_for:
        return Reaping("torn down on request (mtrl teardown)", "StoppedByUser" if running else None)
    if running:
        if now <= deadline_at:
            return None
        return Reaping("past its deadline", "DeadlinePassed")
    return Reaping(f"its execution is {execution_status}")
