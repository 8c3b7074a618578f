"""A reward worker's side of one trajectory of SageMaker's managed multi-turn RL job, through AWS's
own client of its runtime service (`boto3.client("sagemakerjobruntime")`; domain/agent_rft.py
has the contract):

- `RuntimeModel` asks the job's policy for each turn (`Sample`, the job and the trajectory as
  headers) and reads the OpenAI chat completion it answers;
- `RuntimeFeedback` reports the trajectory once: `CompleteRollout` then `UpdateReward`, with
  tokens that make a repeated report a no-op; a failed rollout as `failed` with 0.0.

The service's answer that the trajectory already ended (`ConflictException`) or no longer exists
(`ResourceNotFoundException`, the job ended) is logged, not raised, as the SDK's own client
tolerates both; any other refusal is raised.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import boto3
from botocore.exceptions import BotoCoreError, ClientError

from domain.agent_rft import (
    AgentRolloutRequest,
    Completion,
    RolloutMetadata,
    aws_endpoint,
    report_token,
    sample_body,
)
from reward_envs.interface import Message
from reward_envs.worker.model_client import (
    ModelClient,
    ModelError,
    ModelTimeout,
    ModelTurn,
    model_turn,
)

log = logging.getLogger(__name__)
# What the service answers a report it will not take again, and is no failure of ours.
TOLERATED = ("ConflictException", "ResourceNotFoundException")


# The runtime service's client for a request (its endpoint and region): the composition decides
# which endpoints a worker trusts (`job_runtime_clients`).
RuntimeFor = Callable[[RolloutMetadata], Any]


class FeedbackRefused(RuntimeError):
    """The runtime service refused a report."""


class UntrustedEndpoint(RuntimeError):
    """A request names a runtime endpoint that is not AWS's in its region: no signed call goes
    there."""


def job_runtime_clients(stand_in_url: str | None = None, *, session: Any = boto3) -> RuntimeFor:
    """The runtime service's client for a request: AWS's own endpoint the request names (one
    client per endpoint and region), or, for local runs, the stand-in at `stand_in_url`; made
    by `session` (boto3's default session: the task role's credentials)."""

    @functools.cache
    def client(endpoint: str, region: str) -> Any:
        return session.client("sagemakerjobruntime", region_name=region, endpoint_url=endpoint)

    def runtime_for(metadata: RolloutMetadata) -> Any:
        if stand_in_url is not None:
            return client(stand_in_url, metadata.region)
        if not aws_endpoint(metadata):
            raise UntrustedEndpoint(
                f"trajectory {metadata.trajectory_id}: endpoint {metadata.endpoint} is not AWS's "
                f"job runtime service in {metadata.region}"
            )
        return client(metadata.endpoint.rstrip("/"), metadata.region)

    return runtime_for


def _code(error: ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))


class RuntimeModel(ModelClient):
    """The job's policy, for the turns of the trajectories being played: each turn's request
    (`playing`, by the rollout's sample id) names its job, its trajectory and where its runtime
    service is (`runtime_for`)."""

    def __init__(
        self, runtime_for: RuntimeFor, playing: Callable[[str], AgentRolloutRequest]
    ) -> None:
        self._runtime_for = runtime_for
        self._playing = playing

    def chat(
        self,
        messages: Sequence[Message],
        *,
        sample_id: str,
        step_id: str,
        timeout: float,
        tools: Sequence[Mapping[str, Any]] = (),
    ) -> ModelTurn:
        if timeout <= 0:
            raise ModelTimeout(f"{step_id}: no time left")
        try:
            request = self._playing(sample_id)
        except KeyError:
            raise ModelError(f"{step_id}: no trajectory is being played for {sample_id}") from None
        metadata = request.metadata
        body = sample_body(
            [dict(message) for message in messages],
            tools=[dict(tool) for tool in tools],
            params=request.inference_params,
            model=request.model_name,
        )
        try:
            answer = self._runtime_for(metadata).sample(
                JobArn=metadata.job_arn,
                TrajectoryId=metadata.trajectory_id,
                Body=json.dumps(body).encode(),
            )
            payload = json.loads(answer["Body"].read())
        except ClientError as error:
            raise ModelError(f"{step_id}: Sample refused: {_code(error)}: {error}") from error
        except BotoCoreError as error:
            raise ModelError(
                f"{step_id}: cannot reach the job's runtime service: {error}"
            ) from error
        except json.JSONDecodeError as error:
            raise ModelError(f"{step_id}: Sample's answer is not JSON") from error
        return model_turn(payload, step_id)


class RuntimeFeedback:
    def __init__(self, runtime: Any) -> None:
        self._runtime = runtime

    def completed(self, metadata: RolloutMetadata, rewards: float | Sequence[float]) -> None:
        """The trajectory ended with these rewards (the episode's, or one per turn)."""
        per_turn = [rewards] if isinstance(rewards, int | float) else list(rewards)
        self._report(metadata, "ready", [float(reward) for reward in per_turn])

    def failed(self, metadata: RolloutMetadata, error: str) -> None:
        """The trajectory could not be played (`error` says why): failed, its reward 0.0."""
        log.error("trajectory %s failed: %s", metadata.trajectory_id, error)
        self._report(metadata, "failed", [0.0])

    def _report(self, metadata: RolloutMetadata, status: Completion, rewards: list[float]) -> None:
        ids = {"JobArn": metadata.job_arn, "TrajectoryId": metadata.trajectory_id}
        self._call("complete_rollout", metadata, **ids, Status=status,
                   ClientToken=report_token(metadata, "complete"))  # fmt: skip
        self._call("update_reward", metadata, **ids, Rewards=rewards,
                   ClientToken=report_token(metadata, "reward"))  # fmt: skip

    def _call(self, operation: str, metadata: RolloutMetadata, **parameters: Any) -> None:
        try:
            getattr(self._runtime, operation)(**parameters)
        except ClientError as error:
            if _code(error) in TOLERATED:
                log.warning("trajectory %s: %s not taken: %s", metadata.trajectory_id,
                            operation, error)  # fmt: skip
                return
            raise FeedbackRefused(
                f"trajectory {metadata.trajectory_id}: {operation} refused: {error}"
            ) from error
        except BotoCoreError as error:
            raise FeedbackRefused(
                f"trajectory {metadata.trajectory_id}: {operation} not sent: {error}"
            ) from error
