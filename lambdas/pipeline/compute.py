"""The compute steps of a run, over the backend interfaces (domain/backends.py).

Each step is a thin handler: the state (run id, config, queues) comes in, one backend call
goes out, a small result comes back for the state machine's Choice states. Which backends
serve a deployment is configuration (`REWARD_FLEET_BACKEND`, `TRAINING_CLUSTER_BACKEND`).
"""

from __future__ import annotations

import json
import secrets
import time
from typing import Any

import boto3

from domain import backends
from domain.backends import RunContext
from domain.bucket import run_output_prefix
from domain.runs import RunStore
from lambdas.pipeline import policies
from lambdas.pipeline.ecs_fleet import EcsRewardFleet
from lambdas.pipeline.hyperpod_training import HyperPodTrainingCluster
from lambdas.pipeline.settings import PipelineSettings
from lambdas.router.conversations import ConversationStore

# The deployed planes. Local mode registers its own under "local" (mtrl/local/session.py).
backends.register_fleet("aws", EcsRewardFleet.from_env)
backends.register_cluster("aws", HyperPodTrainingCluster.from_env)


class RunPastDeadline(RuntimeError):
    """The run's deadline passed while it waited for compute."""


def _context(event: dict[str, Any], *, run_token: str = "") -> RunContext:
    run, config = event["run"], event["run"]["config"]
    settings = PipelineSettings.from_env()
    return RunContext(
        run_id=run["run_id"],
        queues=event.get("resources", {}).get("queues", {}),
        router_url=settings.router_url,
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


def _fleet() -> backends.RewardFleet:
    return backends.reward_fleet(PipelineSettings.from_env().reward_fleet_backend)


def _cluster() -> backends.TrainingCluster:
    return backends.training_cluster(PipelineSettings.from_env().training_cluster_backend)


def scale_up(event: dict[str, Any], context: Any = None) -> dict[str, Any]:
    config = event["run"]["config"]
    instances = config["instance_count"]
    _cluster().scale_up(_context(event), instances=instances)
    return {"instances": instances, "scale_to_zero": config["scale_to_zero"]}


def _check_deadline(event: dict[str, Any]) -> None:
    if time.time() > event["run"]["deadline_at"]:
        raise RunPastDeadline(
            f"run {event['run']['run_id']} passed its deadline while waiting for compute"
        )


def nodes_ready(event: dict[str, Any], context: Any = None) -> dict[str, Any]:
    _check_deadline(event)
    wanted = event["run"]["config"]["instance_count"]
    ready = _cluster().nodes_ready(_context(event))
    return {"ready": ready >= wanted, "nodes": ready}


def start_workers(
    event: dict[str, Any], context: Any = None, *, dynamodb: Any = None
) -> dict[str, Any]:
    """Start the reward fleet with a fresh run token (stored hashed; never in the state)."""
    run_id = event["run"]["run_id"]
    token = secrets.token_urlsafe(32)
    store = ConversationStore(
        dynamodb or boto3.client("dynamodb"), PipelineSettings.from_env().conversations_table
    )
    store.put_run(run_id, token=token, queues=event["resources"]["queues"], now=time.time())
    workers = _fleet().start(
        _context(event, run_token=token), workers=event["run"]["config"]["reward_workers"]
    )
    return {"workers": len(workers)}


def workers_healthy(event: dict[str, Any], context: Any = None) -> dict[str, Any]:
    _check_deadline(event)
    wanted = event["run"]["config"]["reward_workers"]
    healthy = _fleet().healthy(_context(event))
    return {"ready": healthy >= wanted, "healthy": healthy}


def submit_job(event: dict[str, Any], context: Any = None) -> dict[str, Any]:
    return {"job": _cluster().submit(_context(event), config=event["run"]["config"])}


def monitor(
    event: dict[str, Any], context: Any = None, *, dynamodb: Any = None, now: float | None = None
) -> dict[str, Any]:
    """One poll: the job's phase, or the pipeline's reason to stop the run
    (lambdas/pipeline/policies.py)."""
    run_id = event["run"]["run_id"]
    config = event["run"]["config"]
    now = time.time() if now is None else now
    record = RunStore(
        dynamodb or boto3.client("dynamodb"), PipelineSettings.from_env().runs_table
    ).get(run_id)
    verdict = record and policies.must_stop(record, budget_usd=config["budget_usd"], now=now)
    if verdict:
        return {"phase": verdict.phase, "reason": verdict.reason}
    status = _cluster().status(_context(event))
    quiet = policies.quiet_polls(status, event.get("job") or {})
    verdict = policies.stalled(
        status,
        quiet,
        rollout_timeout_seconds=config["rollout_timeout_seconds"],
        poll_seconds=event["run"].get("poll_seconds", 60),
    )
    if verdict:
        return {"phase": verdict.phase, "reason": verdict.reason, "step": status.step,
                "quiet_polls": quiet}  # fmt: skip
    return {"phase": status.phase, "reason": status.reason, "step": status.step,
            "quiet_polls": quiet}  # fmt: skip


def collect(event: dict[str, Any], context: Any = None, *, s3: Any = None) -> dict[str, Any]:
    """Write `runs/<run_id>/summary.json` (config, job, outputs found) next to the run's outputs."""
    s3 = s3 or boto3.client("s3")
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


def release_compute(event: dict[str, Any], context: Any = None) -> dict[str, Any]:
    """Teardown of the compute planes (idempotent): workers, job, nodes."""
    if "config" not in event.get("run", {}):
        return {"workers_stopped": 0, "job_objects_deleted": 0}  # failed before registration
    return release(
        _context(event),
        fleet=_fleet(),
        cluster=_cluster(),
        scale_down=event["run"]["config"]["scale_to_zero"],
    )


def release(
    run: RunContext,
    *,
    fleet: backends.RewardFleet,
    cluster: backends.TrainingCluster,
    scale_down: bool,
) -> dict[str, int]:
    """Stop the run's workers, delete its job, let go of its nodes (each step idempotent)."""
    stopped = fleet.stop(run)
    deleted = cluster.delete(run)
    if scale_down:
        cluster.scale_down(run)
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


def release_idle(event: dict[str, Any], context: Any = None) -> dict[str, Any]:
    """Scheduled: scale nodes kept warm to zero once no run took them for the keep-warm period."""
    return {"released": _cluster().release_idle()}
