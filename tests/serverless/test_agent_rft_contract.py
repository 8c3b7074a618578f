"""The managed multi-turn RL runtime contract (domain/agent_rft.py) against AWS's own code: a
rollout request read as the SageMaker SDK's model reads it (sagemaker-train 1.27.0's
`sagemaker/train/rft/`, loaded from source by tests/sagemaker_train_sdk.py), the SDK's headers
where botocore's model of the runtime service puts them, and that model as the docs say."""

from __future__ import annotations

from typing import Any

import botocore.session
import pytest
from pydantic import ValidationError

from domain.agent_rft import AgentRolloutRequest
from tests.sagemaker_train_sdk import rft_headers, rft_models

METADATA = {
    "job_arn": "arn:aws:sagemaker:us-west-2:123456789012:job/AgentRFT/agent-rft-1",
    "trajectory_id": "traj-0007",
    "endpoint": "https://job-runtime.sagemaker.us-west-2.api.aws",
    "region": "us-west-2",
}
RUNTIME = botocore.session.get_session().get_service_model("sagemakerjobruntime")


@pytest.mark.parametrize(
    "payload",
    [
        {"instance": {"prompt": "Guess."}, "metadata": METADATA},
        {"instance": {}, "metadata": {k: v for k, v in METADATA.items() if k != "region"}},
        {
            "instance": {"a": 1},
            "metadata": METADATA,
            "inference_params": {"temperature": 0.7},
            "model_name": "nova",
            "model_endpoint": "https://m",
            "extra": "ignored",
        },  # fmt: skip
        {"instance": {"a": 1}, "metadata": METADATA, "inference_params": {"max_tokens": "64"}},
        {"instance": {"a": 1}, "metadata": METADATA, "inference_params": {"max_tokens": "many"}},
        {"instance": {"a": 1}, "metadata": {**METADATA, "trajectory_id": None}},
        {"instance": "not an object", "metadata": METADATA},
        {"metadata": METADATA},
        {"instance": {}, "metadata": {"job_arn": "j", "trajectory_id": "t"}},
    ],
)
def test_a_rollout_request_is_read_as_the_sdks_model_reads_it(payload: dict[str, Any]) -> None:
    try:
        theirs: Any = rft_models().RolloutRequest.model_validate(payload).model_dump()
    except ValidationError:
        theirs = "refused"
    try:
        ours: Any = AgentRolloutRequest.model_validate(payload).model_dump()
    except ValidationError:
        ours = "refused"
    assert ours == theirs


def test_the_sdks_inference_headers_are_botocores_sample_headers() -> None:
    """The SDK's agent sends the job and the trajectory in the headers botocore's `Sample`
    puts them in: the two clients name them alike."""
    sample = RUNTIME.operation_model("Sample").input_shape.members
    assert rft_headers().make_inference_headers(METADATA) == {
        sample["JobArn"].serialization["name"]: METADATA["job_arn"],
        sample["TrajectoryId"].serialization["name"]: METADATA["trajectory_id"],
    }


def test_botocores_model_of_the_runtime_service_is_as_the_readme_says() -> None:
    """botocore's own model of the runtime service (`sagemakerjobruntime`, API 2026-02-01), which
    the docs set beside the SDK's client as unverified: where each call goes, where the job
    ARN travels, how it is signed, the statuses a completion takes."""
    model = RUNTIME
    assert (model.api_version, model.signing_name) == ("2026-02-01", "sagemaker")
    paths = {name: model.operation_model(name).http["requestUri"] for name in model.operation_names}
    assert paths == {
        "CompleteRollout": "/complete-rollout", "UpdateReward": "/update-reward",
        "Sample": "/sample", "SampleWithResponseStream": "/sample-with-response-stream",
    }  # fmt: skip
    complete = model.operation_model("CompleteRollout").input_shape.members
    assert complete["JobArn"].serialization == {
        "location": "header", "name": "X-Amzn-SageMaker-Job-Arn",
    }  # fmt: skip
    assert complete["Status"].enum == ["ready", "failed"]
    assert complete["ClientToken"].metadata == {"idempotencyToken": True}
    sample = model.operation_model("Sample").input_shape.members
    assert sample["TrajectoryId"].serialization["name"] == "X-Amzn-SageMaker-Trajectory-Id"
