"""SageMaker's managed multi-turn RL ("Agent RFT", CreateJob's JobCategory `AgentRFT`) as its
runtime service and an agent speak to each other.

- The service invokes the agent with a rollout request (sagemaker-train 1.27.0's
  `sagemaker/train/rft/models.py`, which tests/serverless/ check these models against): `instance`
  (the dataset line), `metadata` (`job_arn`, `trajectory_id`, `endpoint` — the runtime service's
  URL —, `region`), optional `inference_params` (`temperature`, `max_tokens`, `top_p`),
  `model_name`, `model_endpoint`.
- The agent calls AWS's runtime service, `sagemakerjobruntime` (API 2026-02-01: botocore's model,
  the SageMaker API reference, the developer guide's "Preparing your agent"): `Sample` (an
  OpenAI-compatible chat request for the trajectory's next turn, the job and the trajectory as
  headers), then `CompleteRollout` (`ready`, or `failed`: never a silent 0) and `UpdateReward`
  (one reward, or one per turn), each with a `ClientToken` that makes a repeated report a no-op.
  Signed with SigV4 as `sagemaker`, so IAM can scope an agent to one job (AWS's
  `AmazonSageMakerJobRuntimeAccess` grants `sagemaker:Sample`, `SampleWithResponseStream`,
  `CompleteRollout` and `UpdateReward` on `job/*`). The SDK's own client reports with a bearer
  token (`sagemaker:CallWithBearerToken`, granted on `*`: no job scoping) instead.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from domain.dataset import DatasetRecord
from domain.protocol import RolloutRequest, sample_id_for

# CreateJob's JobCategory of a training job, and of a held-out evaluation: the service sends
# both's rollout requests to the agent.
JOB_CATEGORY, EVALUATION_CATEGORY = "AgentRFT", "AgentRFTEvaluation"
Completion = Literal["ready", "failed"]
# The service names the trajectory's runtime endpoint in each request; AWS's own for a region is
# `https://job-runtime.sagemaker.<region>.api.aws` (the developer guide, the SDK's default) or
# `…amazonaws.com` (botocore's endpoint rules). An agent sends its signed calls to no other host.
AWS_RUNTIME_ENDPOINT = re.compile(
    r"https://job-runtime\.sagemaker\.(?P<region>[a-z0-9-]+)\.(api\.aws|amazonaws\.com)/?"
)


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


def runtime_endpoint(region: str) -> str:
    """AWS's job runtime endpoint in `region`, as the developer guide names it (one form
    AWS_RUNTIME_ENDPOINT takes)."""
    return f"https://job-runtime.sagemaker.{region}.api.aws"


def aws_endpoint(metadata: RolloutMetadata) -> bool:
    """Whether the request's runtime endpoint is AWS's own, in the request's region."""
    found = AWS_RUNTIME_ENDPOINT.fullmatch(metadata.endpoint)
    return found is not None and found["region"] == metadata.region


def report_token(metadata: RolloutMetadata, report: Literal["complete", "reward"]) -> str:
    """The ClientToken of a trajectory's report: the same for every try of it, so the service
    takes it once however often a redelivered request makes the agent send it."""
    seed = f"{metadata.job_arn}\0{metadata.trajectory_id}\0{report}"
    return hashlib.sha256(seed.encode()).hexdigest()


def sample_body(
    messages: list[dict[str, Any]],
    *,
    tools: list[dict[str, Any]],
    params: InferenceParams | None,
    model: str | None,
) -> dict[str, Any]:
    """The OpenAI-compatible chat request a Sample call carries: the conversation, the tools,
    and the sampling settings the service gave the rollout."""
    body: dict[str, Any] = {"messages": messages}
    if model:
        body["model"] = model
    if tools:
        body["tools"] = tools
    if params is not None:
        body |= params.model_dump(exclude_none=True)
    return body


# A job's ARN: `arn:<partition>:sagemaker:<region>:<account>:job/<category>/<name>` (botocore's
# sagemaker model, CreateJob's JobArn).
JOB_ARN = re.compile(
    r"arn:aws[a-z\-]*:sagemaker:[a-z0-9\-]+:[0-9]{12}:job/(?P<category>[a-zA-Z0-9]+)/"
    r"(?P<name>[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62})"
)


class NotARollout(ValueError):
    """A rollout request no run can play; the text says what is wrong."""


def job_name_of(job_arn: str) -> str:
    """The name of the managed multi-turn RL job `job_arn` names, training or evaluating
    (NotARollout: another ARN)."""
    found = JOB_ARN.fullmatch(job_arn)
    if found is None or found["category"] not in (JOB_CATEGORY, EVALUATION_CATEGORY):
        raise NotARollout(
            f"job_arn {job_arn!r} is not the ARN of an {JOB_CATEGORY} or {EVALUATION_CATEGORY} job"
        )
    return found["name"]


def trajectory_number(trajectory_id: str) -> int:
    """A number for the trajectory (its sample's `_<k>`): 12 hex digits of its digest."""
    return int(hashlib.sha256(trajectory_id.encode()).hexdigest()[:12], 16)


def rollout_request_of(request: AgentRolloutRequest, *, max_length: int) -> RolloutRequest:
    """The rollout a reward worker plays for the service's request: the instance is a line of
    a channel of the job's (train, validation, evaluation), one of our dataset records
    (NotARollout if not)."""
    try:
        record = DatasetRecord.model_validate(request.instance)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(map(str, p['loc'])) or 'instance'}: {p['msg']}" for p in error.errors()
        )
        raise NotARollout(f"instance is not a dataset record: {problems}") from None
    return RolloutRequest(
        sample_id=sample_id_for(record.id, trajectory_number(request.metadata.trajectory_id)),
        max_length=max_length,
        data=record.rollout_data(),
    )
