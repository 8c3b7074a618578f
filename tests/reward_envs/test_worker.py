"""The reward worker against moto's SQS: responses, order per group, poison, retries, heartbeats,
and SIGTERM (stop) without losing or duplicating a response."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import boto3
import pytest

from domain.protocol import RolloutRequest, RolloutResponse, dump, episode_seed, parse
from reward_envs.interface import Message
from reward_envs.wordle import load_environment
from reward_envs.worker.model_client import CallableModel
from reward_envs.worker.queues import Delivery, SqsRolloutQueues
from reward_envs.worker.settings import WorkerSettings
from reward_envs.worker.worker import HEARTBEAT_TICK_SECONDS, RewardWorker, Task, TaskState
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
    ) -> str:
        """Send a request; its SQS message id."""
        payload = (
            body
            if body is not None
            else dump(RolloutRequest(sample_id=sample_id, data={"answer": answer}))
        )
        return self.sqs.send_message(
            QueueUrl=self.requests,
            MessageBody=payload,
            MessageGroupId=group or sample_id,
            MessageDeduplicationId=sample_id,
        )["MessageId"]

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


def test_a_worker_fills_every_free_slot_while_requests_wait(queues: Queues) -> None:
    """16 slots, 16 requests: all 16 episodes play at once (a receive takes at most ten, so
    the rest must be taken while the first ten run), else the barrier breaks."""
    together = threading.Barrier(16, timeout=10)

    def model(_messages: Sequence[Message]) -> str:
        together.wait()
        return "[crane]"

    for index in range(16):
        queues.send(f"rec{index}_0")
    worker_for(queues, CallableModel(model), concurrency=16).run(exit_when_idle=True)
    responses = queues.responses_received()
    assert len(responses) == 16 and all(r.aggregate_score == 1.0 for r in responses)
    assert not together.broken


def test_responses_keep_the_order_of_their_message_group(queues: Queues) -> None:
    """The first request of each group is the slowest (six guesses against one): run in
    parallel, the later ones would answer first."""
    order: list[str] = []
    lock = threading.Lock()
    for index in range(5):
        answer = "slate" if index == 0 else "crane"
        queues.send(f"a_{index}", group="a", answer=answer)
        queues.send(f"b_{index}", group="b", answer=answer)
    model = CallableModel(lambda _messages: "[crane]", delay=0.01)
    worker = worker_for(queues, model, concurrency=8)
    original = worker.queues.complete

    def recording(finished):
        with lock:
            order.extend(response.sample_id for _, response in finished)
        return original(finished)

    worker.queues.complete = recording
    stats = worker.run(exit_when_idle=True)
    for group in "ab":
        assert [s for s in order if s.startswith(group)] == [f"{group}_{i}" for i in range(5)]
    assert (stats.completed, stats.released) == (10, 0)  # nothing given back on the way


def test_after_a_failed_request_the_rest_of_its_group_waits_for_it(queues: Queues) -> None:
    """A failed request is retried; the group's later requests are given back, not answered
    before it."""
    queues.send("g_0", group="g")
    queues.send("g_1", group="g")
    worker = worker_for(queues, instant(), max_receives=3)
    order: list[str] = []
    complete = worker.queues.complete

    def failing_once(finished):
        if not order:
            order.append("failed")
            raise ConnectionError("responses queue unreachable")
        order.extend(response.sample_id for _, response in finished)
        return complete(finished)

    worker.queues.complete = failing_once
    stats = worker.run(exit_when_idle=True)
    assert order == ["failed", "g_0", "g_1"]
    assert (stats.failures, stats.released, stats.completed) == (1, 1, 2)


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
    threading.Timer(0.3, gate.opened.set).start()  # the episodes end while the worker drains
    runner.join(timeout=15)
    assert not runner.is_alive()
    assert sorted(r.sample_id for r in queues.responses_received()) == ["rec_0", "rec_1", "rec_2"]
    assert (worker.stats.completed, worker.stats.released) == (3, 0)


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


def test_an_episode_stops_at_the_workers_turn_limit(queues: Queues) -> None:
    queues.send("long_0", answer="slate")  # "[crane]" never wins
    worker_for(queues, instant(), max_turns=2).run(exit_when_idle=True)
    (response,) = queues.responses_received()
    turns = {metric.name: metric.value for metric in response.metrics}["turns"]
    assert (response.stop_reason, turns) == ("max_turns", 2)


def test_the_rollout_deadline_runs_on_the_workers_clock(queues: Queues) -> None:
    queues.send("late_0", answer="slate")
    worker = worker_for(queues, instant(), rollout_timeout_seconds=10)
    ticks = iter(range(0, 10**6, 4))  # each reading 4 s after the last
    worker.clock = lambda: float(next(ticks))
    worker.run(exit_when_idle=True)
    (response,) = queues.responses_received()
    assert response.stop_reason == "timeout" and "deadline of 10 s" in response.error


def test_a_worker_without_a_run_draws_by_record_alone(queues: Queues) -> None:
    environment = Recording()
    queues.send("rec0_0")
    worker_for(queues, instant(), environment=environment).run(exit_when_idle=True)
    assert environment.drawn == [("rec0", episode_seed("", "rec0"))]


def test_without_a_dead_letter_queue_a_poison_message_goes_back_for_the_redrive(
    aws: None,
) -> None:
    """The queue's own redrive policy moves it after maxReceiveCount: the worker only gives it
    back at once, each time."""
    sqs = Serialized(boto3.client("sqs"))
    fifo = {"FifoQueue": "true"}
    redrive_dlq = sqs.create_queue(QueueName="redrive-dlq.fifo", Attributes=fifo)["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=redrive_dlq, AttributeNames=["QueueArn"])
    policy = {"deadLetterTargetArn": dlq_arn["Attributes"]["QueueArn"], "maxReceiveCount": "2"}
    requests = sqs.create_queue(
        QueueName="req.fifo", Attributes={**fifo, "RedrivePolicy": json.dumps(policy)}
    )["QueueUrl"]
    responses = sqs.create_queue(QueueName="resp.fifo", Attributes=fifo)["QueueUrl"]
    queues = Queues(sqs, requests, responses, redrive_dlq)
    queues.send("bad", body="{not json")
    settings = WorkerSettings(
        rollout_request_queue_url=requests, rollout_response_queue_url=responses, wait_seconds=0
    )
    sqs_queues = SqsRolloutQueues(
        sqs, requests_url=requests, responses_url=responses, dead_letter_url=None
    )
    worker = RewardWorker(queues=sqs_queues, environment=WORDLE, model=instant(), settings=settings)
    stats = worker.run(exit_when_idle=True)
    assert (stats.protocol_errors, stats.dead_lettered) == (2, 0)
    (moved,) = queues.drain(redrive_dlq)
    assert moved["Body"] == "{not json"


def test_poison_and_failures_are_logged_with_what_identifies_them(
    queues: Queues, caplog: pytest.LogCaptureFixture
) -> None:
    poisoned = queues.send("bad", body="{not json")
    queues.send("rec_0")
    worker = worker_for(queues, instant(), max_receives=1)

    def failing(finished):
        raise ConnectionError("responses queue unreachable")

    worker.queues.complete = failing
    with caplog.at_level("WARNING", logger="mtrl.worker"):
        worker.run(exit_when_idle=True)
    messages = [record.getMessage() for record in caplog.records]
    (poison,) = [message for message in messages if message.startswith("poison message ")]
    assert poison.startswith(f"poison message {poisoned}: ") and "not JSON" in poison
    assert "rollout rec_0 failed outside the episode" in messages


class RecordingQueues:
    """The worker's queues, recording visibility extensions (nothing is received)."""

    dead_letter_url = None

    def __init__(self) -> None:
        self.extended: list[str] = []

    def extend(self, delivery: Delivery, seconds: int) -> None:
        self.extended.append(delivery.message_id)


def test_the_heartbeat_looks_for_due_tasks_every_tick(queues: Queues) -> None:
    """An extension is at most one tick late, whatever the visibility timeout."""
    worker = worker_for(queues, instant(), visibility_timeout_seconds=600)
    waits: list[float] = []

    class Stopping:  # stops the heartbeat at its third wait
        def wait(self, timeout: float) -> bool:
            waits.append(timeout)
            return len(waits) == 3

    worker._stopping = Stopping()
    worker._heartbeat()
    assert waits == [HEARTBEAT_TICK_SECONDS] * 3 and HEARTBEAT_TICK_SECONDS <= 0.2


def test_the_heartbeat_extends_every_running_task_that_is_due(aws: None) -> None:
    """A task being sent (or given back) is skipped; the running ones after it still are."""
    queues = RecordingQueues()
    settings = WorkerSettings(
        rollout_request_queue_url="req", rollout_response_queue_url="resp",
        visibility_timeout_seconds=30,
    )  # fmt: skip
    worker = RewardWorker(
        queues=queues, environment=WORDLE, model=instant(), settings=settings, clock=lambda: 100.0
    )
    for name, state in (("sending", TaskState.SENDING), ("running", TaskState.RUNNING)):
        delivery = Delivery(name, f"receipt-{name}", "{}", 1, name)
        worker._tasks[delivery.receipt_handle] = Task(delivery, last_extended=0.0, state=state)
    heartbeat = threading.Thread(target=worker._heartbeat)
    heartbeat.start()
    eventually(lambda: queues.extended, "an extension")
    worker.stop()
    heartbeat.join(timeout=5)
    worker.close()
    assert set(queues.extended) == {"running"}
