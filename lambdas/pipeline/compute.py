"""The compute steps of a run, over the backend interfaces (domain/backends.py).

Each step is thin: the state (run id, config, queues) comes in, one backend call goes out, a
small result comes back for the state machine's Choice states. Which backends serve is decided
where the steps are composed (lambdas/pipeline/composition.py; local mode binds its own).
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from domain.backends import RunContext
from domain.bucket import SUMMARY_OBJECT, run_output_prefix
from domain.run_state import JobReport, RegisteredRun, RunState
from domain.runs import RunStore
from lambdas.pipeline import policies
from lambdas.pipeline.dependencies import Compute, Dependencies
from lambdas.router.conversations import ConversationStore


class RunPastDeadline(RuntimeError):
    """The run's deadline passed while it waited for compute."""


class ComputeSteps:
    def __init__(self, dependencies: Dependencies) -> None:
        self.settings, self.clients = dependencies.settings, dependencies.clients
        self.compute, self.clock = dependencies.compute, dependencies.clock

    def _context(self, state: RunState, *, run_token: str = "") -> RunContext:
        run = state.registered
        return RunContext(
            run_id=run.run_id,
            queues=state.resources.queues if state.resources else {},
            router_url=self.settings.router_url,
            run_token=run_token,
            bucket=state.bucket,
            dataset_key=state.key,
            dataset_version=state.version_id,
            output_prefix=run_output_prefix(run.run_id),
            rollout_request_arn=(state.resources.rollout_request_arn if state.resources else None),
            config=run.config,
        )

    def _check_deadline(self, run: RegisteredRun) -> None:
        if self.clock() > run.deadline_at:
            raise RunPastDeadline(f"run {run.run_id} passed its deadline while waiting for compute")

    def scale_up(self, event: dict[str, Any]) -> dict[str, Any]:
        state = RunState.model_validate(event)
        config = state.registered.config
        self.compute.cluster.scale_up(self._context(state), instances=config.instance_count)
        return {"instances": config.instance_count, "scale_to_zero": config.scale_to_zero}

    def nodes_ready(self, event: dict[str, Any]) -> dict[str, Any]:
        state = RunState.model_validate(event)
        self._check_deadline(state.registered)
        ready = self.compute.cluster.nodes_ready(self._context(state))
        return {"ready": ready >= state.registered.config.instance_count, "nodes": ready}

    def start_workers(self, event: dict[str, Any]) -> dict[str, Any]:
        """Start the reward fleet with a fresh run token (stored hashed; never in the state)."""
        state = RunState.model_validate(event)
        context = self._context(state, run_token=secrets.token_urlsafe(32))
        store = ConversationStore(self.clients("dynamodb"), self.settings.conversations_table)
        store.put_run(
            context.run_id,
            token=context.run_token,
            queues=context.queues,
            model=context.training.model,
            now=self.clock(),
        )
        workers = self.compute.fleet.start(context, workers=context.training.reward_workers)
        return {"workers": len(workers)}

    def workers_healthy(self, event: dict[str, Any]) -> dict[str, Any]:
        state = RunState.model_validate(event)
        self._check_deadline(state.registered)
        healthy = self.compute.fleet.healthy(self._context(state))
        return {"ready": healthy >= state.registered.config.reward_workers, "healthy": healthy}

    def submit_job(self, event: dict[str, Any]) -> dict[str, Any]:
        state = RunState.model_validate(event)
        return {"job": self.compute.cluster.submit(self._context(state))}

    def monitor(self, event: dict[str, Any]) -> dict[str, Any]:
        """One poll: the job's phase, or the pipeline's reason to stop the run
        (lambdas/pipeline/policies.py)."""
        state = RunState.model_validate(event)
        run = state.registered
        record = RunStore(self.clients("dynamodb"), self.settings.runs_table).get(run.run_id)
        verdict = record and policies.must_stop(
            record, budget_usd=run.config.budget_usd, now=self.clock()
        )
        if verdict:
            return JobReport(phase=verdict.phase, reason=verdict.reason).model_dump(mode="json")
        status = self.compute.cluster.status(self._context(state))
        quiet = policies.quiet_polls(status, state.job)
        verdict = policies.stalled(
            status,
            quiet,
            rollout_timeout_seconds=run.config.rollout_timeout_seconds,
            poll_seconds=run.poll_seconds,
        )
        phase, reason = (
            (verdict.phase, verdict.reason) if verdict else (status.phase, status.reason)
        )
        report = JobReport(phase=phase, reason=reason, step=status.step, quiet_polls=quiet)
        return report.model_dump(mode="json")

    def collect(self, event: dict[str, Any]) -> dict[str, Any]:
        """Write `runs/<run_id>/summary.json` (config, job, outputs found, checkpoints) next to
        the outputs."""
        state = RunState.model_validate(event)
        s3, run = self.clients("s3"), state.registered
        prefix = run_output_prefix(run.run_id)
        listed = s3.list_objects_v2(Bucket=state.bucket, Prefix=prefix).get("Contents", [])
        outputs = sorted(item["Key"].removeprefix(prefix) for item in listed)
        summary = {
            "run_id": run.run_id,
            "dataset": f"s3://{state.bucket}/{state.key}",
            "config": run.config.model_dump(mode="json"),
            "job": state.job.model_dump(mode="json") if state.job else None,
            "outputs": outputs,
            "checkpoints": checkpoints(s3, bucket=state.bucket, prefix=prefix, outputs=outputs),
        }
        s3.put_object(
            Bucket=state.bucket,
            Key=f"{prefix}{SUMMARY_OBJECT}",
            Body=json.dumps(summary, indent=2).encode(),
            ContentType="application/json",
        )
        return {"results": f"s3://{state.bucket}/{prefix}", "objects": len(listed)}

    def release_compute(self, event: dict[str, Any]) -> dict[str, Any]:
        """Teardown of the compute planes (idempotent): workers, job, nodes."""
        state = RunState.model_validate(event)
        if state.run is None:
            return {"workers_stopped": 0, "job_objects_deleted": 0}  # failed before registration
        return release(
            self._context(state), self.compute, scale_down=state.run.config.scale_to_zero
        )

    def release_idle(self, event: dict[str, Any]) -> dict[str, Any]:
        """Scheduled: scale nodes kept warm to zero once no run took them for the keep-warm
        period."""
        return {"released": self.compute.cluster.release_idle()}


# Where a HyperPod Nova job records its checkpoints: `<output_s3_path>/<job>/manifest.json`,
# whose `checkpoint_s3_bucket` the Nova Forge SDK reads (amzn-nova-forge 1.4.10,
# util/checkpoint_util.py).
MANIFEST = "manifest.json"


def checkpoints(s3: Any, *, bucket: str, prefix: str, outputs: list[str]) -> list[dict[str, Any]]:
    """The checkpoints the run's job recorded: each job's manifest and where it points."""
    found = []
    for output in outputs:
        job, _, name = output.rpartition("/")
        if name != MANIFEST or "/" in job or not job:
            continue
        body = s3.get_object(Bucket=bucket, Key=f"{prefix}{output}")["Body"].read()
        try:
            location = json.loads(body).get("checkpoint_s3_bucket")
        except (json.JSONDecodeError, AttributeError):
            location = None  # recorded as found, its location unknown
        found.append(
            {"job": job, "manifest": f"s3://{bucket}/{prefix}{output}", "checkpoint": location}
        )
    return found


def release(run: RunContext, compute: Compute, *, scale_down: bool) -> dict[str, int]:
    """Stop the run's workers, delete its job, let go of its nodes (each step idempotent)."""
    stopped = compute.fleet.stop(run)
    deleted = compute.cluster.delete(run)
    if scale_down:
        compute.cluster.scale_down(run)
    return {"workers_stopped": stopped, "job_objects_deleted": deleted}


def teardown_context(run_id: str) -> RunContext:
    """What the backends need to find and remove a run's compute: its id, from which every
    name derives (stopping, deleting and scaling down read nothing of its data). For the
    reaper, which has the run's record but not its state."""
    return RunContext(
        run_id=run_id,
        queues={},
        router_url=None,
        run_token="",
        bucket="",
        dataset_key="",
        dataset_version=None,
        output_prefix=run_output_prefix(run_id),
    )
