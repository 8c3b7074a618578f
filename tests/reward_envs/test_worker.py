"""The reward worker against moto's SQS: responses, order per group, poison, retries, heartbeats,
and SIGTERM (stop) without losing or duplicating a response."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import boto3
import pytest

from domain.protocol import RolloutRequest, RolloutResponse, dump, episode_seed, parse
from reward_envs.interface import Message
from reward_envs.wordle import load_environment
from reward_envs.worker.model_client import CallableModel
from reward_envs.worker.queues import SqsRolloutQueues
from reward_envs.worker.settings import WorkerSettings
from reward_envs.worker.worker import RewardWorker
from tests.aws import Serialized
from tests.reward_envs.test_rollout import Recording

WORDLE = load_environment()


@dataclass
class Queues:
    sqs: object
    requests: str
    responses: str
    dlq: str

    def send(
        self,
        sample_id: str,
        group: str | None = None,
        answer: str = "crane",
        body: str | None = None,
    ) -> None:
        payload = (
            body
            if body is not None
            else dump(RolloutRequest(sample_id=sample_id, data={"answer": answer}))
        )
        self.sqs.send_message(
            QueueUrl=self.requests,
            MessageBody=payload,
            MessageGroupId=group or sample_id,
            MessageDeduplicationId=sample_id,
        )

    def drain(self, url: str) -> list[dict]:
        messages = []
        while batch := self.sqs.receive_message(
            QueueUrl=url,
            MaxNumberOfMessages=10,
            MessageAttributeNames=["All"],
            MessageSystemAttributeNames=["All"],
        ).get("Messages"):
            messages += batch
            for message in batch:
                self.sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
        return messages

    def responses_received(self) -> list[RolloutResponse]:
        return [parse(RolloutResponse, m["Body"]) for m in self.drain(self.responses)]


@pytest.fixture
def queues(aws: None) -> Iterator[Queues]:
    sqs = Serialized(boto3.client("sqs"))
    fifo = {"FifoQueue": "true"}
    urls = [
        sqs.create_queue(QueueName=f"run-{n}.fifo", Attributes=fifo)["QueueUrl"]
        for n in ("req", "resp", "dlq")
    ]
    yield Queues(sqs, *urls)


def worker_for(
    queues: Queues, model: CallableModel, environment=WORDLE, **overrides
) -> RewardWorker:
    settings = WorkerSettings(
        rollout_request_queue_url=queues.requests,
        rollout_response_queue_url=queues.responses,
        dead_letter_queue_url=queues.dlq,
        **{"wait_seconds": 0, "retry_delay_seconds": 0, **overrides},
    )
    sqs_queues = SqsRolloutQueues(
        queues.sqs,
        requests_url=queues.requests,
        responses_url=queues.responses,
        dead_letter_url=queues.dlq,
    )
    return RewardWorker(queues=sqs_queues, environment=environment, model=model, settings=settings)


def instant(reply: str = "[crane]") -> CallableModel:
    return CallableModel(lambda _messages: reply)


def eventually(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def test_every_request_gets_exactly_one_response(queues: Queues) -> None:
    for index in range(24):
        queues.send(f"rec{index % 6}_{index}", group=f"rec{index % 6}")
    stats = worker_for(queues, instant(), concurrency=4).run(exit_when_idle=True)
    responses = queues.responses_received()
    assert sorted(r.sample_id for r in responses) == sorted(f"rec{i % 6}_{i}" for i in range(24))
    assert all(
        r.stop_reason == "end_of_conversation" and r.aggregate_score == 1.0 for r in responses
    )
    assert stats.completed == 24 and not queues.drain(queues.requests)


def test_responses_keep_the_order_of_their_message_group(queues: Queues) -> None:
    order: list[str] = []
    lock = threading.Lock()

    def model(messages: Sequence[Message]) -> str:
        return "[crane]"

    for index in range(5):
        queues.send(f"a_{index}", group="a")
        queues.send(f"b_{index}", group="b")
    worker = worker_for(queues, CallableModel(model), concurrency=8)
    original = worker.queues.complete

    def recording(finished):
        with lock:
            order.extend(response.sample_id for _, response in finished)
        return original(finished)

    worker.queues.complete = recording
    worker.run(exit_when_idle=True)
    for group in "ab":
        assert [s for s in order if s.startswith(group)] == [f"{group}_{i}" for i in range(5)]


def test_poison_messages_go_to_the_dead_letter_queue_at_once(queues: Queues) -> None:
    queues.send("bad-json", body="{not json")
    queues.send(
        "bad-version",
        body=json.dumps({"version": "v9", "sample_id": "x", "data": {"answer": "crane"}}),
    )
    queues.send("good_0")
    stats = worker_for(queues, instant()).run(exit_when_idle=True)
    dead = queues.drain(queues.dlq)
    reasons = sorted(m["MessageAttributes"]["reason"]["StringValue"] for m in dead)
    assert (
        len(reasons) == 2 and "not JSON" in reasons[0] and "unsupported version 'v9'" in reasons[1]
    )
    assert [r.sample_id for r in queues.responses_received()] == ["good_0"]
    assert stats.protocol_errors == 2 and not queues.drain(queues.requests)


def test_a_crashing_environment_is_reported_not_retried(queues: Queues) -> None:
    class Crashing(type(WORDLE)):
        def reset(self, record, *, seed=0):
            raise RuntimeError("boom")

    queues.send("rec_0")
    worker_for(queues, instant(), environment=Crashing()).run(exit_when_idle=True)
    (response,) = queues.responses_received()
    assert response.stop_reason == "env_error" and response.aggregate_score is None
    assert "boom" in response.error and not queues.drain(queues.dlq)


def test_a_request_that_cannot_be_answered_is_retried_then_dead_lettered(queues: Queues) -> None:
    queues.send("rec_0")
    worker = worker_for(queues, instant(), max_receives=3)
    attempts = []

    def failing(finished):
        attempts.extend(delivery.receive_count for delivery, _ in finished)
        raise ConnectionError("responses queue unreachable")

    worker.queues.complete = failing
    stats = worker.run(exit_when_idle=True)
    assert attempts == [1, 2, 3]
    (dead,) = queues.drain(queues.dlq)
    assert (
        "failed 3 times, last: ConnectionError"
        in dead["MessageAttributes"]["reason"]["StringValue"]
    )
    assert stats.failures == 3 and stats.dead_lettered == 1 and not queues.responses_received()


def test_retries_wait_longer_each_time_up_to_a_minute(queues: Queues) -> None:
    """A request that failed n times comes back after n x the retry delay, at most 60 s."""
    queues.send("rec_0")
    worker = worker_for(queues, instant(), max_receives=4, retry_delay_seconds=25)
    delays: list[int] = []
    release = worker.queues.release

    def released_at_once(delivery, *, delay_seconds: int = 0) -> None:
        delays.append(delay_seconds)
        release(delivery, delay_seconds=0)  # the test does not wait for the delay

    worker.queues.release = released_at_once

    def failing(finished):
        raise ConnectionError("responses queue unreachable")

    worker.queues.complete = failing
    worker.run(exit_when_idle=True)
    assert delays == [25, 50, 60]  # then the fourth failure dead-letters it
    assert len(queues.drain(queues.dlq)) == 1


class Gate:
    """A model that waits until the test opens the gate (bounded), counting who is waiting."""

    def __init__(self, reply: str = "[crane]") -> None:
        self.opened = threading.Event()
        self.waiting = 0
        self._lock = threading.Lock()
        self.model = CallableModel(self._reply)
        self.reply = reply

    def _reply(self, _messages: Sequence[Message]) -> str:
        with self._lock:
            self.waiting += 1
        self.opened.wait(timeout=30)
        return self.reply


def test_visibility_is_extended_once_per_period_while_an_episode_runs(queues: Queues) -> None:
    """Every third of the visibility timeout, and not again until the next third: the heartbeat
    ticks often (its clock readings are counted), extending only tasks that are due."""
    queues.send("slow_0")
    gate = Gate()
    now, ticks = [0.0], [0]

    def clock() -> float:
        if threading.current_thread().name == "visibility-heartbeat":
            ticks[0] += 1
        return now[0]

    worker = worker_for(queues, gate.model, visibility_timeout_seconds=30)
    worker.clock = clock
    extended: list[int] = []
    original = worker.queues.extend
    worker.queues.extend = lambda delivery, seconds: (
        extended.append(seconds),
        original(delivery, seconds),
    )

    def some_ticks_later() -> None:
        seen = ticks[0]
        eventually(lambda: ticks[0] >= seen + 3, "three heartbeat ticks")

    runner = threading.Thread(target=worker.run, kwargs={"exit_when_idle": True})
    runner.start()
    eventually(lambda: gate.waiting == 1, "the episode to start")
    some_ticks_later()
    assert extended == []  # not due yet
    now[0] = 11  # past a third of the visibility timeout
    eventually(lambda: extended == [30], "a visibility extension")
    now[0] = 20  # 9 s after it: not due again
    some_ticks_later()
    assert extended == [30]
    now[0] = 21
    eventually(lambda: len(extended) == 2, "the next extension")
    some_ticks_later()
    assert extended == [30, 30]
    gate.opened.set()
    runner.join(timeout=10)
    assert [r.sample_id for r in queues.responses_received()] == ["slow_0"]


def test_stop_finishes_episodes_within_the_grace_period(queues: Queues) -> None:
    for index in range(3):
        queues.send(f"rec_{index}")
    gate = Gate()
    worker = worker_for(queues, gate.model, shutdown_grace_seconds=10)
    runner = threading.Thread(target=worker.run)
    runner.start()
    eventually(lambda: gate.waiting == 3, "three episodes in flight")
    worker.stop()
    gate.opened.set()
    runner.join(timeout=15)
    assert not runner.is_alive()
    assert sorted(r.sample_id for r in queues.responses_received()) == ["rec_0", "rec_1", "rec_2"]


def test_stop_releases_unfinished_episodes_without_losing_or_duplicating(queues: Queues) -> None:
    for index in range(3):
        queues.send(f"rec_{index}")
    gate = Gate()
    worker = worker_for(queues, gate.model, shutdown_grace_seconds=0.05)
    runner = threading.Thread(target=worker.run)
    runner.start()
    eventually(lambda: gate.waiting == 3, "three episodes in flight")
    worker.stop()
    runner.join(timeout=10)
    assert not runner.is_alive() and worker.stats.released == 3
    # The abandoned episodes now finish: they must not answer.
    gate.opened.set()
    worker.close()
    assert queues.responses_received() == []
    # Another worker answers each request exactly once.
    second = worker_for(queues, instant())
    second.run(exit_when_idle=True)
    assert sorted(r.sample_id for r in queues.responses_received()) == ["rec_0", "rec_1", "rec_2"]


def test_a_request_processed_twice_yields_one_response(queues: Queues) -> None:
    queues.send("rec_0")
    worker = worker_for(queues, instant())
    (delivery,) = worker.queues.receive(max_messages=1, wait_seconds=0, visibility_timeout=30)
    response = parse(
        RolloutResponse,
        dump(
            RolloutResponse(
                sample_id="rec_0",
                stop_reason="end_of_conversation",
                rewards={"aggregate_score": 1.0},
            )
        ),
    )
    assert worker.queues.complete([(delivery, response)]) == [None]
    # A redelivery answered again, e.g. after a lost delete: SQS drops the second response.
    worker.queues.complete([(delivery, response)])
    assert len(queues.responses_received()) == 1


def test_a_slow_model_ends_in_a_timeout_response(queues: Queues) -> None:
    queues.send("slow_0")
    slow = CallableModel(lambda _messages: "[crane]", delay=5.0)
    worker_for(queues, slow, rollout_timeout_seconds=0.05).run(exit_when_idle=True)
    (response,) = queues.responses_received()
    assert response.stop_reason == "timeout" and response.aggregate_score is None
    assert "no reply within" in response.error


def test_the_worker_draws_each_episode_with_its_run_and_record_seed(queues: Queues) -> None:
    environment = Recording()
    for index in range(3):
        queues.send(f"rec{index % 2}_{index}", group=f"rec{index % 2}")
    worker_for(queues, instant(), environment=environment, run_id="run-a").run(exit_when_idle=True)
    assert sorted(environment.drawn) == sorted(
        (record, episode_seed("run-a", record)) for record in ("rec0", "rec1", "rec0")
    )
