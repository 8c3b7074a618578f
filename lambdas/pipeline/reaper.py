"""The reaper: on a schedule, every run past its deadline or whose execution is no longer
running; on request, one run now (`mtrl teardown RUN`) or the idle GPU nodes (`--all-idle`)."""

from __future__ import annotations

from domain.run_state import Reaped, ReapLater, ReapRequest, ReapResult
from domain.runs import FINISHED, RunStore
from lambdas.pipeline import policies
from lambdas.pipeline.compute import release, teardown_context
from lambdas.pipeline.dependencies import Dependencies
from lambdas.pipeline.resources import teardown_run


class Reaper:
    def __init__(self, dependencies: Dependencies) -> None:
        self.settings, self.clients = dependencies.settings, dependencies.clients
        self.compute, self.clock = dependencies.compute, dependencies.clock

    def reap(self, request: ReapRequest) -> ReapResult:
        """Tear down every run past its deadline, or whose execution is no longer running
        (stopped by hand, or lost) — so nothing keeps burning money unnoticed; or the one run
        asked for, whatever its state. Compute first, as the state machine does; a run whose
        compute cannot be released yet stays unfinished and is tried again on the next
        schedule."""
        if request.release_idle:
            released = self.compute.cluster.release_idle(immediately=True)
            return ReapResult(released_idle=released)
        sfn = self.clients("stepfunctions")
        runs = RunStore(self.clients("dynamodb"), self.settings.runs_table)
        now = self.clock()
        if request.run_id is None:
            candidates = runs.unfinished()
        else:
            asked = runs.get(request.run_id)
            if asked is None:
                return ReapResult(unknown=request.run_id)
            candidates = [asked]
        wiring = self.settings.router_wiring(self.clients)
        reaped: list[Reaped] = []
        retry: list[ReapLater] = []
        for run in candidates:
            execution = self.settings.execution_arn(run.run_id)
            try:
                status = sfn.describe_execution(executionArn=execution)["status"]
            except sfn.exceptions.ExecutionDoesNotExist:
                status = "MISSING"
            decided = policies.reaping(
                execution_status=status,
                deadline_at=run.deadline_at,
                now=now,
                asked_for=request.run_id is not None,
            )
            if decided is None:
                continue
            reason = decided.reason
            if decided.stop_with is not None:
                sfn.stop_execution(
                    executionArn=execution,
                    error=decided.stop_with,
                    cause=f"run {run.run_id}: {reason}",
                )
            try:
                # A backend that cannot be made (or fails) is this run's retry, not the others'.
                released = release(teardown_context(run.run_id), self.compute, scale_down=True)
            except Exception as failure:  # noqa: BLE001 - one run's trouble must not stop the others
                retry.append(
                    ReapLater(run_id=run.run_id, error=f"{type(failure).__name__}: {failure}")
                )
                continue
            result = teardown_run(wiring, run_id=run.run_id)
            if run.status not in FINISHED:
                runs.update(run.run_id, now=now, status="failed", error=f"reaped: {reason}")
            reaped.append(
                Reaped(
                    run_id=run.run_id,
                    reason=reason,
                    workers_stopped=released.workers_stopped,
                    job_objects_deleted=released.job_objects_deleted,
                    queues_deleted=result.queues_deleted,
                    leftover=result.leftover,
                )
            )
        return ReapResult(reaped=reaped, retry=retry)
