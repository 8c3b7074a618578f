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
from domain.bucket import run_output_prefix
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

    def _context(self, event: dict[str, Any], *, run_token: str = "") -> RunContext:
        run, config = event["run"], event["run"]["config"]
        return RunContext(
            run_id=run["run_id"],
            queues=event.get("resources", {}).get("queues", {}),
            router_url=self.settings.router_url,
            run_token=run_token,
            environment=config["environment"],
            bucket=event["bucket"],
            dataset_key=event["key"],
            dataset_version=event.get("version_id"),
            output_prefix=run_output_prefix(run["run_id"]),
            settings={
                "rollout_concurrency": config["rollout_concurrency"],
                "rollout_timeout_seconds": config["rollout_timeout_seconds"],
                "reward_workers_max": config.get("reward_workers_max"),
                "max_turns": config["max_turns"],
            },
        )

    def _check_deadline(self, event: dict[str, Any]) -> None:
        if self.clock() > event["run"]["deadline_at"]:
            raise RunPastDeadline(
                f"run {event['run']['run_id']} passed its deadline while waiting for compute"
            )

    def scale_up(self, event: dict[str, Any]) -> dict[str, Any]:
        config = event["run"]["config"]
        instances = config["instance_count"]
        self.compute.cluster.scale_up(self._context(event), instances=instances)
        return {"instances": instances, "scale_to_zero": config["scale_to_zero"]}

    def nodes_ready(self, event: dict[str, Any]) -> dict[str, Any]:
        self._check_deadline(event)
        wanted = event["run"]["config"]["instance_count"]
        ready = self.compute.cluster.nodes_ready(self._context(event))
        return {"ready": ready >= wanted, "nodes": ready}

    def start_workers(self, event: dict[str, Any]) -> dict[str, Any]:
        """Start the reward fleet with a fresh run token (stored hashed; never in the state)."""
        run_id = event["run"]["run_id"]
        token = secrets.token_urlsafe(32)
        store = ConversationStore(self.clients("dynamodb"), self.settings.conversations_table)
        store.put_run(run_id, token=token, queues=event["resources"]["queues"], now=self.clock())
        workers = self.compute.fleet.start(
            self._context(event, run_token=token), workers=event["run"]["config"]["reward_workers"]
        )
        return {"workers": len(workers)}

    def workers_healthy(self, event: dict[str, Any]) -> dict[str, Any]:
        self._check_deadline(event)
        wanted = event["run"]["config"]["reward_workers"]
        healthy = self.compute.fleet.healthy(self._context(event))
        return {"ready": healthy >= wanted, "healthy": healthy}

    def submit_job(self, event: dict[str, Any]) -> dict[str, Any]:
        job = self.compute.cluster.submit(self._context(event), config=event["run"]["config"])
        return {"job": job}

    def monitor(self, event: dict[str, Any]) -> dict[str, Any]:
        """One poll: the job's phase, or the pipeline's reason to stop the run
        (lambdas/pipeline/policies.py)."""
        run_id, config = event["run"]["run_id"], event["run"]["config"]
        record = RunStore(self.clients("dynamodb"), self.settings.runs_table).get(run_id)
        verdict = record and policies.must_stop(
            record, budget_usd=config["budget_usd"], now=self.clock()
        )
        if verdict:
            return {"phase": verdict.phase, "reason": verdict.reason}
        status = self.compute.cluster.status(self._context(event))
        quiet = policies.quiet_polls(status, event.get("job") or {})
        verdict = policies.stalled(
            status,
            quiet,
            rollout_timeout_seconds=config["rollout_timeout_seconds"],
            poll_seconds=event["run"].get("poll_seconds", 60),
        )
        phase, reason = (
            (verdict.phase, verdict.reason) if verdict else (status.phase, status.reason)
        )
        return {"phase": phase, "reason": reason, "step": status.step, "quiet_polls": quiet}

    def collect(self, event: dict[str, Any]) -> dict[str, Any]:
        """Write `runs/<run_id>/summary.json` (config, job, outputs found) next to the outputs."""
        s3 = self.clients("s3")
        bucket, run_id = event["bucket"], event["run"]["run_id"]
        prefix = run_output_prefix(run_id)
        listed = s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
        summary = {
            "run_id": run_id,
            "dataset": f"s3://{bucket}/{event['key']}",
            "config": event["run"]["config"],
            "job": event.get("job"),
            "outputs": sorted(item["Key"].removeprefix(prefix) for item in listed),
        }
        s3.put_object(
            Bucket=bucket,
            Key=f"{prefix}summary.json",
            Body=json.dumps(summary, indent=2).encode(),
            ContentType="application/json",
        )
        return {"results": f"s3://{bucket}/{prefix}", "objects": len(listed)}

    def release_compute(self, event: dict[str, Any]) -> dict[str, Any]:
        """Teardown of the compute planes (idempotent): workers, job, nodes."""
        if "config" not in event.get("run", {}):
            return {"workers_stopped": 0, "job_objects_deleted": 0}  # failed before registration
        return release(
            self._context(event),
            self.compute,
            scale_down=event["run"]["config"]["scale_to_zero"],
        )

    def release_idle(self, event: dict[str, Any]) -> dict[str, Any]:
        """Scheduled: scale nodes kept warm to zero once no run took them for the keep-warm
        period."""
        return {"released": self.compute.cluster.release_idle()}


def release(run: RunContext, compute: Compute, *, scale_down: bool) -> dict[str, int]:
    """Stop the run's workers, delete its job, let go of its nodes (each step idempotent)."""
    stopped = compute.fleet.stop(run)
    deleted = compute.cluster.delete(run)
    if scale_down:
        compute.cluster.scale_down(run)
    return {"workers_stopped": stopped, "job_objects_deleted": deleted}


def teardown_context(run_id: str, *, bucket: str, key: str, version_id: str | None) -> RunContext:
    """What the backends need to find and remove a run's compute: its id (names derive from
    it) and where its data is. For the reaper, which has the run's record but not its state."""
    return RunContext(
        run_id=run_id,
        queues={},
        router_url=None,
        run_token="",
        environment="",
        bucket=bucket,
        dataset_key=key,
        dataset_version=version_id,
        output_prefix=run_output_prefix(run_id),
    )
