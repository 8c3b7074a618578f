"""100 multi-turn rollouts through the whole router under moto: reward workers (real worker,
real Wordle) -> SigV4 client -> proxy over HTTP -> generate queue -> scripted trainer ->
generate-response queue -> consumer -> conversation table -> back to the workers."""

from __future__ import annotations

from collections import Counter

from botocore.credentials import Credentials

from domain.protocol import RolloutRequest, RolloutResponse, dump, parse
from reward_envs.wordle import load_environment
from reward_envs.worker.router_client import RouterClient, RouterRolloutQueues
from reward_envs.worker.settings import WorkerSettings
from reward_envs.worker.worker import RewardWorker
from tests.router.conftest import RUN, TOKEN, Router

ROLLOUTS = int(__import__("os").environ.get("E2E_ROLLOUTS", "100"))


def test_a_hundred_rollouts_each_answered_once_and_every_turn_recorded_once(router: Router) -> None:
    sqs, queues = router.sqs, router.queues
    for index in range(ROLLOUTS):
        request = RolloutRequest(sample_id=f"rec{index}_0", data={"answer": "crane"})
        sqs.send_message(
            QueueUrl=queues.rollout_requests,
            MessageBody=dump(request),
            MessageGroupId=request.sample_id,
            MessageDeduplicationId=str(index),
        )
    with router.serving(wait_seconds=0.2) as (url_server, trainer):
        client = RouterClient(
            url_server.url,
            run_id=RUN,
            run_token=TOKEN,
            region="us-east-1",
            credentials=lambda: Credentials("AKIDTEST", "secret"),
        )
        settings = WorkerSettings(
            rollout_request_queue_url=queues.rollout_requests,
            rollout_response_queue_url=queues.rollout_responses,
            dead_letter_queue_url=queues.dlq,
            wait_seconds=0,
            rollout_timeout_seconds=60,
        )
        reporting = RouterRolloutQueues(
            sqs, client, requests_url=queues.rollout_requests, dead_letter_url=queues.dlq
        )
        worker = RewardWorker(
            queues=reporting, environment=load_environment(), model=client, settings=settings
        )
        stats = worker.run(exit_when_idle=True)
    responses = [
        parse(RolloutResponse, m["Body"]) for m in router.messages(queues.rollout_responses)
    ]
    assert Counter(r.sample_id for r in responses) == Counter(
        {f"rec{i}_0": 1 for i in range(ROLLOUTS)}
    )
    assert all(
        r.stop_reason == "end_of_conversation" and r.aggregate_score == 0.8 for r in responses
    )
    assert stats.completed == ROLLOUTS and trainer.answered == 3 * ROLLOUTS
    steps = router.db.scan(
        TableName="conversations",
        FilterExpression="begins_with(#i, :s)",
        ExpressionAttributeNames={"#i": "item"},
        ExpressionAttributeValues={":s": {"S": "step#"}},
    )["Items"]
    assert len(steps) == 3 * ROLLOUTS and all(step["status"]["S"] == "completed" for step in steps)
    assert router.store.run_summary(RUN, now=router.clock() + 1e6, stuck_after_seconds=60) == {
        "in_flight": 0,
        "finished": ROLLOUTS,
        "failed": 0,
        "stuck": 0,
    }
    assert not router.messages(queues.dlq) and router.consumer.counters.duplicates == 0
