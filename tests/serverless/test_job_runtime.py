"""A reward worker's side of a managed job's trajectory (reward_envs/worker/job_runtime.py)
through AWS's own boto3 client of the runtime service, against the local stand-in of that
service (mtrl/local/job_runtime.py), which answers as botocore's model of it says: the turns
played through Sample, one report per trajectory however often it is sent, a failure reported
as failed, the refusals a report may meet tolerated or raised as the SDK's client does."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import boto3
import pytest
from botocore import UNSIGNED
from botocore.config import Config

from domain.agent_rft import AgentRolloutRequest, RolloutMetadata, aws_endpoint, report_token
from domain.protocol import RolloutRequest
from mtrl.local.job_runtime import JobRuntimeStandIn, Policy
from reward_envs.wordle import load_environment
from reward_envs.worker.job_runtime import (
    FeedbackRefused,
    RuntimeFeedback,
    RuntimeModel,
    UntrustedEndpoint,
    job_runtime_clients,
)
from reward_envs.worker.model_client import ModelError
from reward_envs.worker.rollout import play_rollout

JOB = "arn:aws:sagemaker:us-east-1:123456789012:job/AgentRFT/mtrl-run-wordle-0123456789"
WORDLE = load_environment()


def guesses(*words: str) -> Policy:
    """A policy that answers a trajectory's n-th turn with the n-th word."""

    def answer(_job: str, _trajectory: str, request: dict[str, Any]) -> dict[str, Any]:
        turn = sum(message["role"] == "assistant" for message in request["messages"])
        message = {"role": "assistant", "content": f"My guess: [{words[turn]}]"}
        return {"choices": [{"message": message, "finish_reason": "stop"}]}

    return answer


def client(url: str, *, region: str = "us-east-1", **config: Any) -> Any:
    return boto3.client(
        "sagemakerjobruntime", region_name=region, endpoint_url=url,
        aws_access_key_id="AKIDEXAMPLE", aws_secret_access_key="secret",
        config=Config(retries={"max_attempts": 1}, **config),
    )  # fmt: skip


@contextmanager
def service(policy: Policy) -> Iterator[tuple[JobRuntimeStandIn, Any]]:
    with JobRuntimeStandIn(policy) as stand_in:
        stand_in.open_job(JOB)
        yield stand_in, client(stand_in.url)


def rollout_request(stand_in: JobRuntimeStandIn) -> AgentRolloutRequest:
    """What the service sends the agent for a new trajectory of the job."""
    return AgentRolloutRequest.model_validate({
        "instance": {"id": "wordle-7", "metadata": {"answer": "crane"}},
        "metadata": {"job_arn": JOB, "trajectory_id": stand_in.new_trajectory(JOB),
                     "endpoint": stand_in.url, "region": "us-east-1"},
        "inference_params": {"temperature": 0.7, "max_tokens": 64},
        "model_name": "nova-textgeneration-lite-v2",
    })  # fmt: skip


def one_trajectory(runtime: Any, request: AgentRolloutRequest) -> RuntimeModel:
    """The job's policy for `request`'s trajectory alone, through `runtime`."""
    return RuntimeModel(lambda _metadata: runtime, lambda _sample: request)


def play(model: RuntimeModel) -> Any:
    return play_rollout(
        WORDLE, model, RolloutRequest(sample_id="wordle-7_0", data={"answer": "crane"})
    )


def test_an_episode_plays_each_turn_through_sample_and_is_reported_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with service(guesses("slate", "crane")) as (stand_in, runtime):
        request = rollout_request(stand_in)
        played = play(one_trajectory(runtime, request))
        assert played.response.stop_reason == "end_of_conversation"
        trajectory = stand_in.trajectory(JOB, request.metadata.trajectory_id)
        # Each turn the conversation so far, with the service's sampling settings and model.
        sent = [turn["request"] for turn in trajectory.turns]
        assert [len(body["messages"]) for body in sent] == [1, 3]
        assert all(
            {k: body[k] for k in ("model", "temperature", "max_tokens")}
            == {"model": "nova-textgeneration-lite-v2", "temperature": 0.7, "max_tokens": 64}
            for body in sent
        )
        assert sent[1]["messages"][1] == {"role": "assistant", "content": "My guess: [slate]"}
        feedback = RuntimeFeedback(runtime)
        with caplog.at_level(logging.WARNING):
            for _ in range(2):  # a redelivered request reports again: taken once, no conflict
                feedback.completed(request.metadata, played.turn_rewards)
        assert caplog.records == []
        assert trajectory.status == "ready"
        assert trajectory.rewards == played.turn_rewards and len(played.turn_rewards) == 2
        assert len(trajectory.reports) == 2  # one CompleteRollout, one UpdateReward


def test_a_rollout_that_could_not_be_played_is_reported_failed_never_a_silent_zero() -> None:
    with service(guesses()) as (stand_in, runtime):
        request = rollout_request(stand_in)
        RuntimeFeedback(runtime).failed(request.metadata, "the environment raised")
        trajectory = stand_in.trajectory(JOB, request.metadata.trajectory_id)
        assert (trajectory.status, trajectory.rewards) == ("failed", [0.0])


def test_a_trajectory_that_already_ended_or_a_job_that_is_gone_is_logged_not_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with service(guesses("crane")) as (stand_in, runtime):
        ended = rollout_request(stand_in).metadata
        runtime.complete_rollout(JobArn=JOB, TrajectoryId=ended.trajectory_id, Status="failed",
                                 ClientToken="another agent")  # fmt: skip
        gone = rollout_request(stand_in).metadata
        with caplog.at_level(logging.WARNING):
            RuntimeFeedback(runtime).completed(ended, 1.0)
            stand_in.close_job(JOB)
            RuntimeFeedback(runtime).completed(gone, 1.0)
        assert stand_in.trajectory(JOB, ended.trajectory_id).status == "failed"  # the other's
        logged = [record.getMessage() for record in caplog.records]
        assert len(logged) == 3, logged  # the ended one's completion; the gone one's two reports
        assert "complete_rollout not taken" in logged[0] and "ConflictException" in logged[0]
        assert all("ResourceNotFoundException" in message for message in logged[1:])


def test_any_other_refusal_of_a_report_is_raised() -> None:
    with service(guesses("crane")) as (stand_in, runtime):
        request = rollout_request(stand_in)
        play(one_trajectory(runtime, request))  # one turn: won at once
        with pytest.raises(FeedbackRefused, match="update_reward refused: .*ValidationException"):
            RuntimeFeedback(runtime).completed(request.metadata, [1.0, 0.0, 0.0])


def test_a_turn_the_service_refuses_is_a_model_error_and_the_episode_no_score() -> None:
    with service(guesses("slate", "crane")) as (stand_in, runtime):
        request = rollout_request(stand_in)
        RuntimeFeedback(runtime).failed(request.metadata, "given up")
        played = play(one_trajectory(runtime, request))  # sealed: no turn may be added
        assert (played.response.stop_reason, played.response.aggregate_score) == ("timeout", None)
        with pytest.raises(ModelError, match="Sample refused: ValidationException"):
            one_trajectory(runtime, request).chat([], sample_id="s", step_id="s_0", timeout=5)


def test_a_call_not_signed_as_sagemaker_in_the_region_is_refused() -> None:
    with service(guesses("crane")) as (stand_in, _):
        request = rollout_request(stand_in)
        for unsigned in (client(stand_in.url, region="eu-west-1"),
                         client(stand_in.url, signature_version=UNSIGNED)):  # fmt: skip
            with pytest.raises(ModelError, match="AccessDeniedException"):
                one_trajectory(unsigned, request).chat([], sample_id="s", step_id="s_0", timeout=5)


def test_the_stand_in_serves_each_operation_of_botocores_model_and_refuses_as_it_names() -> None:
    with service(guesses("crane")) as (stand_in, runtime):
        model = runtime.meta.service_model
        assert {op.name for op in stand_in.routes.values()} == set(model.operation_names)
        bad_arn = "arn:aws:sagemaker:us-east-1:123456789012:training-job/x"
        with pytest.raises(runtime.exceptions.ValidationException):
            runtime.sample(JobArn=bad_arn, TrajectoryId="t", Body=b"{}")
        with pytest.raises(runtime.exceptions.ResourceNotFoundException):
            runtime.update_reward(JobArn=JOB, TrajectoryId="no-such-trajectory", Rewards=[1.0])
        tid = stand_in.new_trajectory(JOB)
        with pytest.raises(runtime.exceptions.ConflictException):  # rewards before completion
            runtime.update_reward(JobArn=JOB, TrajectoryId=tid, Rewards=[1.0])
        answer = runtime.sample(JobArn=JOB, TrajectoryId=tid, Body=json.dumps(
            {"messages": [{"role": "user", "content": "Play."}]}).encode())  # fmt: skip
        assert answer["ContentType"] == "application/json"
        assert (
            json.loads(answer["Body"].read())["choices"][0]["message"]["content"]
            == "My guess: [crane]"
        )


@pytest.mark.parametrize(
    ("endpoint", "region", "trusted"),
    [
        ("https://job-runtime.sagemaker.us-east-1.api.aws", "us-east-1", True),
        ("https://job-runtime.sagemaker.us-east-1.amazonaws.com/", "us-east-1", True),
        ("https://job-runtime.sagemaker.us-east-1.api.aws", "eu-west-1", False),
        ("https://job-runtime.sagemaker.us-east-1.api.aws.example.com", "us-east-1", False),
        ("http://job-runtime.sagemaker.us-east-1.api.aws", "us-east-1", False),
        ("http://127.0.0.1:8080", "us-east-1", False),
    ],
)  # fmt: skip
def test_only_aws_own_runtime_endpoint_in_the_requests_region_is_trusted(
    endpoint: str, region: str, trusted: bool
) -> None:
    metadata = RolloutMetadata(job_arn=JOB, trajectory_id="t", endpoint=endpoint, region=region)
    assert aws_endpoint(metadata) is trusted


def test_each_report_of_a_trajectory_has_its_own_token_every_time() -> None:
    one = RolloutMetadata(job_arn=JOB, trajectory_id="t-1", endpoint="e")
    other = one.model_copy(update={"trajectory_id": "t-2"})
    tokens = {report_token(m, r) for m in (one, other) for r in ("complete", "reward")}
    assert len(tokens) == 4 and report_token(one, "complete") == report_token(one, "complete")


def test_a_worker_signs_calls_for_aws_own_endpoint_or_the_local_stand_in_only() -> None:
    aws = RolloutMetadata(job_arn=JOB, trajectory_id="t", region="us-east-1",
                          endpoint="https://job-runtime.sagemaker.us-east-1.api.aws")  # fmt: skip
    runtime_for = job_runtime_clients()
    assert runtime_for(aws).meta.endpoint_url == aws.endpoint
    assert runtime_for(aws) is runtime_for(aws)  # one client per endpoint
    elsewhere = aws.model_copy(update={"endpoint": "https://collector.example.com"})
    with pytest.raises(UntrustedEndpoint, match="is not AWS's job runtime service in us-east-1"):
        runtime_for(elsewhere)
    local = job_runtime_clients("http://127.0.0.1:8123")
    assert local(elsewhere).meta.endpoint_url == "http://127.0.0.1:8123"
