"""100 multi-turn rollouts through the whole router under moto: reward workers (real worker,
real Wordle) -> SigV4 client -> proxy over HTTP -> generate queue -> scripted trainer ->
generate-response queue -> consumer -> conversation table -> back to the workers."""

from __future__ import annotations

import json
from collections import Counter, defaultdict

from botocore.credentials import Credentials

from domain.episodes import EvaluationStage
from domain.protocol import GenerateRequest, RolloutRequest, RolloutResponse, dump, parse
from reward_envs import support_desk
from reward_envs.interface import Environment
from reward_envs.wordle import load_environment
from reward_envs.worker.router_client import RouterClient, RouterRolloutQueues
from reward_envs.worker.settings import WorkerSettings
from reward_envs.worker.worker import RewardWorker, WorkerStats
from tests.router.conftest import RUN, TOKEN, Router
from tests.router.test_nova_contract import DOCUMENTED_ROLLOUT_REQUEST
from tests.router.test_rollout_forwarder import forwarder, invoke, serving

ROLLOUTS = int(__import__("os").environ.get("E2E_ROLLOUTS", "100"))


def enqueue(router: Router, request: RolloutRequest, number: int) -> None:
    router.sqs.send_message(
        QueueUrl=router.queues.rollout_requests,
        MessageBody=dump(request),
        MessageGroupId=request.sample_id,
        MessageDeduplicationId=str(number),
    )


def work(router: Router, url: str, environment: Environment) -> WorkerStats:
    """A reward worker on the run's queues, through the router at `url`, until idle."""
    queues = router.queues
    client = RouterClient(
        url,
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
        router.sqs, client, requests_url=queues.rollout_requests, dead_letter_url=queues.dlq
    )
    worker = RewardWorker(
        queues=reporting, environment=environment, model=client, settings=settings
    )
    return worker.run(exit_when_idle=True)


def test_a_hundred_rollouts_each_answered_once_and_every_turn_recorded_once(router: Router) -> None:
    queues = router.queues
    for index in range(ROLLOUTS):
        request = RolloutRequest(sample_id=f"rec{index}_0", data={"answer": "crane"})
        enqueue(router, request, index)
    with router.serving(wait_seconds=0.2) as (url_server, trainer):
        stats = work(router, url_server.url, load_environment())
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


def test_tool_calls_travel_the_router_unchanged_both_ways(router: Router) -> None:
    """Support-desk cases worked by the oracle as the trainer: every assistant turn (tool calls,
    `content: null`) and every tool answer comes back in the next generate request as the same
    JSON, with the environment's tool definitions; every case is solved."""
    environment = support_desk.load_environment()
    queues = router.queues
    cases = 6
    for index in range(cases):
        request = RolloutRequest(
            sample_id=f"desk{index}_0", data=dict(support_desk.record_for(index).metadata)
        )
        enqueue(router, request, index)
    seen: dict[str, list[tuple[dict, dict]]] = defaultdict(list)  # sample -> (request, reply)

    def oracle(request: GenerateRequest) -> dict:
        sent = json.loads(dump(request))  # the request as it came off the queue
        reply = support_desk.oracle_reply(sent["messages"])
        seen[request.sample_id].append((sent, reply))
        return reply

    with router.serving(wait_seconds=0.2, reply=oracle) as (url_server, _trainer):
        work(router, url_server.url, environment)
    responses = [
        parse(RolloutResponse, m["Body"]) for m in router.messages(queues.rollout_responses)
    ]
    assert sorted(r.aggregate_score for r in responses) == [1.0] * cases
    assert len(seen) == cases
    tools = json.loads(json.dumps(list(environment.tools)))
    for turns in seen.values():
        assert any(reply["content"] is None and reply["tool_calls"] for _, reply in turns)
        for (sent, reply), (following, _) in zip(turns, turns[1:], strict=False):
            assert sent["tools"] == tools
            held = len(sent["messages"])
            assert following["messages"][:held] == sent["messages"]
            assert following["messages"][held] == reply  # exactly what the trainer sent
            assert following["messages"][held + 1]["role"] == "tool"
            assert following["messages"][held + 1]["tool_call_id"] == reply["tool_calls"][0]["id"]


def test_rollouts_of_an_ended_phase_are_dropped_by_the_workers_not_retried(
    router: Router,
) -> None:
    """Held-out samples asked for in the baseline evaluation, still on the queue when training
    opens: the real worker takes each, the proxy refuses its turn and its report (410), and the
    worker deletes the request: nothing reaches training's job, nothing is dead-lettered."""
    serving(router, stage=EvaluationStage.BASELINE)
    sent = forwarder(router)
    for index in range(3):
        invoke(sent, {**DOCUMENTED_ROLLOUT_REQUEST, "sample_id": f"held{index}_0"})
    router.store.open_phase(RUN, "training", now=router.clock())
    with router.serving(wait_seconds=0.2) as (url_server, trainer):
        work(router, url_server.url, load_environment())
        assert trainer.answered == 0
    assert not router.messages(router.queues.rollout_responses)
    left = router.sqs.get_queue_attributes(
        QueueUrl=router.queues.rollout_requests,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    assert set(left.values()) == {"0"}  # deleted: neither waiting nor given back for later
    assert not router.messages(router.queues.dlq)
    assert router.store.reports(RUN) == []
