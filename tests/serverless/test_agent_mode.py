"""A managed job's rollouts from end to end, offline: the job's requests through the agent Lambda
(lambdas/router/agent_forwarder.py) onto the run's queue (moto), the run's reward worker in
agent mode (reward_envs/worker/agent_mode.py) playing Wordle against the job's policy and
reporting to the job's runtime service (the stand-in, mtrl/local/job_runtime.py): every
trajectory reported once, with the environment's reward, or failed — never a silent 0."""

from __future__ import annotations

import json
from typing import Any

import boto3
import pytest

from domain.episodes import phase_of
from domain.protocol import RolloutResponse
from domain.run_queues import create_run_queues
from lambdas.router.agent_forwarder import AgentForwarder
from lambdas.router.conversations import ConversationStore, create_table
from mtrl.local.job_runtime import JobRuntimeStandIn
from reward_envs.wordle import load_environment
from reward_envs.worker.agent_mode import AgentMode, AgentQueues
from reward_envs.worker.queues import Delivery
from reward_envs.worker.settings import WorkerSettings
from reward_envs.worker.worker import RewardWorker
from tests.serverless.test_job_runtime import client

RUN, JOB_NAME = "wordle-0123456789", "test-run-wordle-0123456789"
JOB = f"arn:aws:sagemaker:us-east-1:123456789012:job/AgentRFT/{JOB_NAME}"
SECRETS = {"w-0": "crane", "w-1": "slate", "w-2": "crane"}
POISONED = "w-poison"  # the policy fails on its prompt: the service's error, the rollout failed


def policy(_job: str, _trajectory: str, request: dict[str, Any]) -> dict[str, Any]:
    if "poison" in request["messages"][0]["content"]:
        raise RuntimeError("the policy's GPU fell over")
    return {"choices": [{"message": {"role": "assistant", "content": "[crane]"}}]}


@pytest.mark.usefixtures("aws")
def test_a_jobs_rollouts_are_played_by_the_runs_workers_and_reported_once() -> None:
    sqs, db = boto3.client("sqs"), boto3.client("dynamodb")
    create_table(db, "conversations")
    store = ConversationStore(db, "conversations")
    queues = create_run_queues(sqs, prefix="test", run_id=RUN)
    store.put_run(RUN, token="t", queues=queues.urls(), model="nova-lite-2", now=0.0,
                  deadline_at=10_000.0, jobs=(JOB_NAME,))  # fmt: skip
    store.open_phase(RUN, phase_of(None), now=0.0)
    forwarder = AgentForwarder(sqs, store, prefix="test", clock=lambda: 1.0)
    with JobRuntimeStandIn(policy) as service:
        service.open_job(JOB)
        trajectories = {}
        for record, secret in [*SECRETS.items(), (POISONED, "crane")]:
            prompt = "poison" if record == POISONED else "Play Wordle."
            trajectories[record] = service.new_trajectory(JOB)
            forwarder.handle({
                "instance": {"id": record, "metadata": {"prompt": prompt, "answer": secret}},
                "metadata": {"job_arn": JOB, "trajectory_id": trajectories[record],
                             "endpoint": service.url, "region": "us-east-1"},
            })  # fmt: skip
        mode = AgentMode(lambda _metadata: client(service.url), max_length=4096)
        settings = WorkerSettings(
            rollout_request_queue_url=queues.rollout_requests, run_id=RUN, wait_seconds=0,
            concurrency=2,
        )  # fmt: skip
        worker = RewardWorker(
            queues=mode.queues(sqs, requests_url=queues.rollout_requests, dead_letter_url=queues.dlq),
            environment=load_environment(), model=mode.model, settings=settings, read=mode.read,
        )  # fmt: skip
        stats = worker.run(exit_when_idle=True)
        worker.close()
        played = {record: service.trajectory(JOB, tid) for record, tid in trajectories.items()}
    assert (stats.completed, stats.dead_lettered, stats.failures) == (4, 0, 0)
    for record in ("w-0", "w-2"):  # won at the first guess
        assert (played[record].status, len(played[record].turns)) == ("ready", 1)
        assert played[record].rewards is not None and played[record].rewards[0] > 0.5
    lost = played["w-1"]  # six guesses of crane against slate
    assert (lost.status, len(lost.turns)) == ("ready", 6) and lost.rewards is not None
    assert lost.rewards[0] < played["w-0"].rewards[0]  # type: ignore[index]
    assert (played[POISONED].status, played[POISONED].rewards) == ("failed", [0.0])
    assert (
        sqs.get_queue_attributes(
            QueueUrl=queues.rollout_requests, AttributeNames=["ApproximateNumberOfMessages"]
        )["Attributes"]["ApproximateNumberOfMessages"]
        == "0"
    )


@pytest.mark.usefixtures("aws")
def test_a_request_given_back_or_dead_lettered_is_no_longer_kept_as_played() -> None:
    """A worker that gives a request back (shutting down, or to retry it later) or dead-letters
    it keeps nothing of it: the next worker to take it plays it afresh, and a long-lived worker
    does not accumulate the trajectories it let go."""
    sqs = boto3.client("sqs")
    queues = create_run_queues(sqs, prefix="test", run_id=RUN)
    mode = AgentMode(lambda _metadata: None, max_length=4096)
    agent_queues = mode.queues(
        sqs, requests_url=queues.rollout_requests, dead_letter_url=queues.dlq
    )
    for trajectory in ("t-1", "t-2"):
        body = json.dumps({
            "instance": {"id": f"w-{trajectory}", "metadata": {"prompt": "Play.", "answer": "crane"}},
            "metadata": {"job_arn": JOB, "trajectory_id": trajectory,
                         "endpoint": "https://job-runtime.sagemaker.us-east-1.api.aws"},
        })  # fmt: skip
        sqs.send_message(
            QueueUrl=queues.rollout_requests, MessageBody=body, MessageGroupId=trajectory,
            MessageDeduplicationId=trajectory,
        )  # fmt: skip
    deliveries = agent_queues.receive(max_messages=2, wait_seconds=0, visibility_timeout=60)
    played = [mode.read(delivery.body).sample_id for delivery in deliveries]
    assert [mode.playing(sample).metadata.trajectory_id for sample in played] == ["t-1", "t-2"]
    agent_queues.release(deliveries[0])
    agent_queues.dead_letter(deliveries[1], "poisoned")
    for sample in played:
        with pytest.raises(KeyError):
            mode.playing(sample)


@pytest.mark.usefixtures("aws")
def test_a_rollout_is_among_the_runs_reports_before_the_runtime_has_it() -> None:
    """AWS's evaluation job completes once its runtime has every rollout, and the run's
    episodes are read from its reports then: the worker reports to the router first, so none
    is still on its way (the serverless example's final evaluation read 31 of 32 otherwise)."""
    sqs = boto3.client("sqs")
    url = sqs.create_queue(QueueName="requests.fifo", Attributes={"FifoQueue": "true"})["QueueUrl"]
    reported: list[str] = []

    class Router:  # what `report_to_router` calls of a RouterClient
        def report(self, response: RolloutResponse, *, request_id: str) -> None:
            reported.append(response.sample_id)

    class Runtime:  # the AgentMode's side: the job's runtime service
        told: list[tuple[str, list[str]]] = []

        def report(self, response: RolloutResponse) -> None:
            self.told.append((response.sample_id, list(reported)))

        def forget(self, body: str) -> None: ...

    runtime = Runtime()
    queues = AgentQueues(sqs, runtime, requests_url=url, dead_letter_url=None, router=Router())  # type: ignore[arg-type]
    response = RolloutResponse(
        sample_id="w-0_0", stop_reason="end_of_conversation", rewards={"aggregate_score": 1.0}
    )
    assert queues.complete([(Delivery("m-1", "h-1", "{}", 1, None), response)]) == [None]
    assert runtime.told == [("w-0_0", ["w-0_0"])]  # the router had it when the runtime was told
