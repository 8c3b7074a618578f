"""Worker settings, from `MTRL_*` environment variables (the ECS task definition sets them)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class WorkerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MTRL_", frozen=True)

    rollout_request_queue_url: str
    rollout_response_queue_url: str | None = None
    dead_letter_queue_url: str | None = None
    environment: str = "wordle"
    environment_args: dict[str, Any] = {}  # JSON: the environment's load_environment arguments
    concurrency: int = Field(default=16, ge=1, le=512)
    rollout_timeout_seconds: float = Field(default=600.0, gt=0)
    max_turns: int | None = Field(default=None, ge=1)
    visibility_timeout_seconds: int = Field(default=120, ge=10, le=43200)
    wait_seconds: int = Field(default=10, ge=0, le=20)
    max_receives: int = Field(default=3, ge=1, le=100)
    retry_delay_seconds: int = Field(default=5, ge=0, le=60)
    shutdown_grace_seconds: float = Field(default=25.0, ge=0)
    router_url: str | None = None
    run_id: str | None = None
    run_token: str | None = None
    model_base_url: str | None = None
    model_name: str = "policy"
    model_api_key: str | None = None
    # The trajectory store (reward_envs/worker/trajectory_store.py): off without a bucket.
    trajectory_bucket: str | None = None
    trajectory_flush_rows: int = Field(default=256, ge=1)
    trajectory_flush_seconds: float = Field(default=30.0, gt=0)
    trajectory_buffer_mib: int = Field(default=64, ge=1)
    config_hash: str | None = None  # the run's training config (TrainingConfig.fingerprint)
    # Agent mode (a serverless run: reward_envs/worker/agent_mode.py): the queue carries a
    # managed job's requests, played against the job's policy and reported to its runtime
    # service — AWS's, at the endpoint a request names, or a local stand-in's at this URL.
    agent_rft: bool = False
    job_runtime_url: str | None = None
    max_length: int = Field(default=10240, gt=1, description="a rollout's tokens (agent mode)")

    @model_validator(mode="after")
    def _heartbeat_fits(self) -> WorkerSettings:
        if self.wait_seconds * 2 >= self.visibility_timeout_seconds:
            raise ValueError("visibility_timeout_seconds must be more than twice wait_seconds")
        if self.router_url and not (self.run_id and self.run_token):
            raise ValueError("router_url needs run_id and run_token (MTRL_RUN_ID, MTRL_RUN_TOKEN)")
        if self.trajectory_bucket and not self.run_id:
            raise ValueError(
                "trajectory_bucket needs run_id (MTRL_RUN_ID): trajectories are a run's"
            )
        return self
