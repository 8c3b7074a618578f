"""SageMaker's managed multi-turn RL ("Agent RFT", CreateJob's JobCategory `AgentRFT`) as its
runtime service and an agent speak to each other: the contract of sagemaker-train 1.27.0
(`sagemaker/train/rft/`: models.py, headers.py, feedback.py) and of sagemaker-core 2.27.0's
bearer token (`sagemaker/core/token_generator/`), which tests/serverless/ check this module
against, function for function.

- The service invokes the agent with a rollout request: `instance` (the dataset line),
  `metadata` (`job_arn`, `trajectory_id`, `endpoint` — the runtime service's URL —, `region`),
  optional `inference_params` (`temperature`, `max_tokens`, `top_p`), `model_name`,
  `model_endpoint`.
- The agent calls the model with two headers naming the job and the trajectory.
- The agent reports each trajectory to the runtime service: `POST /complete-rollout`
  `{"JobArn", "TrajectoryId", "Status": "ready" | "failed"}`, then `POST /update-reward`
  `{"JobArn", "TrajectoryId", "Rewards": [float, ...]}` (one per turn allowed), each with a
  bearer token; a failed rollout is `failed` with reward 0.0 (what the SDK's `report_error`
  sends). An answer saying the trajectory is already in a terminal status is not an error.

Where the service is (no `endpoint` in the metadata): `https://job-runtime.sagemaker.<region>.api.aws`.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any, Literal

from botocore.auth import SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from pydantic import BaseModel

JOB_CATEGORY = "AgentRFT"
JOB_ARN_HEADER = "X-Amzn-SageMaker-Job-Arn"
TRAJECTORY_HEADER = "X-Amzn-SageMaker-Trajectory-Id"
COMPLETE_PATH, REWARD_PATH = "/complete-rollout", "/update-reward"
Completion = Literal["ready", "failed"]
# What the service answers a report on a trajectory that already ended (feedback.py).
ALREADY_PROCESSED = ("not in valid status", "Cannot transition trajectory")
# The bearer token: a SigV4-presigned `CallWithBearerToken` request to SageMaker, base64'd.
TOKEN_PREFIX, TOKEN_HOST = "sagemaker-api-key-", "sagemaker.amazonaws.com"
TOKEN_SECONDS = 12 * 3600


class RolloutMetadata(BaseModel):
    job_arn: str
    trajectory_id: str
    endpoint: str
    region: str = "us-west-2"


class InferenceParams(BaseModel):
    temperature: float | None = None
    max_tokens: int | None = None
    top_p: float | None = None


class AgentRolloutRequest(BaseModel):
    """What the service sends the agent for one trajectory."""

    instance: dict[str, Any]
    metadata: RolloutMetadata
    inference_params: InferenceParams | None = None
    model_name: str | None = None
    model_endpoint: str | None = None


def runtime_endpoint(metadata: RolloutMetadata) -> str:
    """The runtime service's URL for this trajectory's reports."""
    return (metadata.endpoint or f"https://job-runtime.sagemaker.{metadata.region}.api.aws").rstrip(
        "/"
    )


def inference_headers(metadata: RolloutMetadata) -> dict[str, str]:
    """The headers every model call of the trajectory carries."""
    named = {JOB_ARN_HEADER: metadata.job_arn, TRAJECTORY_HEADER: metadata.trajectory_id}
    return {header: value for header, value in named.items() if value}


def completion_body(metadata: RolloutMetadata, status: Completion) -> dict[str, Any]:
    return {"JobArn": metadata.job_arn, "TrajectoryId": metadata.trajectory_id, "Status": status}


def reward_body(metadata: RolloutMetadata, rewards: Sequence[float]) -> dict[str, Any]:
    return {
        "JobArn": metadata.job_arn,
        "TrajectoryId": metadata.trajectory_id,
        "Rewards": [float(reward) for reward in rewards],
    }


def already_processed(answer: str) -> bool:
    """Whether the service's answer says the trajectory had already ended."""
    return any(marker in answer for marker in ALREADY_PROCESSED)


def bearer_token(credentials: Credentials, region: str, *, seconds: int = TOKEN_SECONDS) -> str:
    """The runtime service's bearer token for these credentials, valid `seconds`."""
    request = AWSRequest(
        method="POST",
        url=f"https://{TOKEN_HOST}/",
        headers={"host": TOKEN_HOST},
        params={"Action": "CallWithBearerToken"},
    )
    SigV4QueryAuth(
        credentials.get_frozen_credentials(), "sagemaker", region, expires=seconds
    ).add_auth(request)
    presigned = request.url.removeprefix("https://") + "&Version=1"
    return TOKEN_PREFIX + base64.b64encode(presigned.encode()).decode()
