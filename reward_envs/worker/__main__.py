"""`python -m reward_envs.worker`: the reward worker process (the container's entry point).

Configured by MTRL_* environment variables (see settings.py). Exit codes: 0 after a clean
stop (SIGTERM/SIGINT), 2 for a configuration error, with one line saying what to fix.
"""

from __future__ import annotations

import logging
import os
import signal
import sys

import boto3
from pydantic import ValidationError
from pydantic_settings import SettingsError

from domain.bucket import trajectories_prefix
from reward_envs.registry import EnvironmentNotFound, load
from reward_envs.worker.agent_mode import AgentMode
from reward_envs.worker.job_runtime import job_runtime_clients
from reward_envs.worker.model_client import ModelClient, OpenAICompatibleClient
from reward_envs.worker.queues import SqsRolloutQueues
from reward_envs.worker.router_client import RouterClient, RouterRolloutQueues
from reward_envs.worker.settings import WorkerSettings
from reward_envs.worker.trajectory_store import TrajectoryStore, s3_put
from reward_envs.worker.worker import RewardWorker, read_v0


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        settings = WorkerSettings()
    except ValidationError as error:
        problem = error.errors(include_url=False)[0]
        key = (
            "MTRL_" + "_".join(str(part) for part in problem["loc"]).upper()
            if problem["loc"]
            else "settings"
        )
        print(
            f"reward worker: {key}: {problem['msg'].removeprefix('Value error, ')}", file=sys.stderr
        )
        return 2
    except SettingsError as error:  # a JSON setting that is not JSON (MTRL_ENVIRONMENT_ARGS)
        print(f"reward worker: {error}: {error.__cause__}", file=sys.stderr)
        return 2
    if (
        not settings.agent_rft
        and not settings.router_url
        and not (settings.model_base_url and settings.rollout_response_queue_url)
    ):
        print(
            "reward worker: set MTRL_ROUTER_URL (with MTRL_RUN_ID and MTRL_RUN_TOKEN), "
            "MTRL_MODEL_BASE_URL with MTRL_ROLLOUT_RESPONSE_QUEUE_URL, or MTRL_AGENT_RFT=true",
            file=sys.stderr,
        )
        return 2
    try:
        environment = load(settings.environment, **settings.environment_args)
    except EnvironmentNotFound as missing:
        print(f"reward worker: MTRL_ENVIRONMENT(_ARGS): {missing}", file=sys.stderr)
        return 2
    if settings.agent_rft:
        mode = AgentMode(
            job_runtime_clients(settings.job_runtime_url), max_length=settings.max_length
        )
        queues: SqsRolloutQueues = mode.queues(
            boto3.client("sqs"),
            requests_url=settings.rollout_request_queue_url,
            dead_letter_url=settings.dead_letter_queue_url,
            router=_router(settings) if settings.router_url else None,
        )
        model, read = mode.model, mode.read
    else:
        (queues, model), read = _model_and_queues(settings), read_v0
    worker = RewardWorker(
        queues=queues,
        environment=environment,
        model=model,
        settings=settings,
        trajectories=_trajectory_store(settings),
        read=read,
    )
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: worker.stop())
    stats = worker.run()
    logging.getLogger("mtrl.worker").info("stopped: %s", stats)
    if worker.trajectories is not None:
        logging.getLogger("mtrl.worker").info("trajectories: %s", worker.trajectories.stats)
    logging.shutdown()
    return 0


def _trajectory_store(settings: WorkerSettings) -> TrajectoryStore | None:
    if not settings.trajectory_bucket:
        return None
    return TrajectoryStore(
        s3_put(boto3.client("s3"), settings.trajectory_bucket),
        prefix=trajectories_prefix(settings.run_id or ""),
        flush_rows=settings.trajectory_flush_rows,
        flush_seconds=settings.trajectory_flush_seconds,
        max_buffered_bytes=settings.trajectory_buffer_mib * 1024 * 1024,
    )


def _router(settings: WorkerSettings) -> RouterClient:
    """The run's router, signed with the task role's credentials."""
    session = boto3.Session()
    return RouterClient(
        settings.router_url or "",
        run_id=settings.run_id or "",
        run_token=settings.run_token or "",
        region=session.region_name or "us-east-1",
        credentials=lambda: session.get_credentials().get_frozen_credentials(),
    )


def _model_and_queues(settings: WorkerSettings) -> tuple[SqsRolloutQueues, ModelClient]:
    """Through the run's router (the deployed path) or straight to an OpenAI-compatible model."""
    sqs = boto3.client("sqs")
    if settings.router_url:
        router = _router(settings)
        reporting = RouterRolloutQueues(
            sqs,
            router,
            requests_url=settings.rollout_request_queue_url,
            dead_letter_url=settings.dead_letter_queue_url,
        )
        return reporting, router
    queues = SqsRolloutQueues(
        sqs,
        requests_url=settings.rollout_request_queue_url,
        responses_url=settings.rollout_response_queue_url or "",
        dead_letter_url=settings.dead_letter_queue_url,
    )
    model = OpenAICompatibleClient(
        settings.model_base_url or "", settings.model_name, api_key=settings.model_api_key
    )
    return queues, model


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    # Released episodes may still be waiting on the model in pool threads: do not wait for them.
    os._exit(code)
