"""A trainer's rollout inbox: with steps in flight at once, an answer for a later step's sample
is kept for that step, one for no sample in flight is dropped, and every message it read is
deleted from the queue."""

from __future__ import annotations

from typing import Any

from domain.protocol import RolloutResponse, dump
from domain.trainer_job import RolloutInbox

URL = "https://sqs.local/rollout-responses.fifo"


class ResponseQueue:
    """One queue, read ten at a time; what was deleted is kept by receipt handle."""

    def __init__(self, bodies: list[str]) -> None:
        self.messages = [{"Body": body, "ReceiptHandle": str(n)} for n, body in enumerate(bodies)]
        self.deleted: list[str] = []
        self.receives = 0

    def receive_message(self, *, QueueUrl: str, MaxNumberOfMessages: int, **_: Any) -> dict:  # noqa: N803
        assert QueueUrl == URL
        self.receives += 1
        taken, self.messages = (
            self.messages[:MaxNumberOfMessages],
            self.messages[MaxNumberOfMessages:],
        )
        return {"Messages": taken} if taken else {}

    def delete_message_batch(self, *, QueueUrl: str, Entries: list[dict]) -> dict:  # noqa: N803
        self.deleted += [entry["ReceiptHandle"] for entry in Entries]
        return {"Successful": [], "Failed": []}


def _answer(sample: str, reward: float) -> str:
    return dump(RolloutResponse(sample_id=sample, stop_reason="end_of_conversation",
                                rewards={"aggregate_score": reward}))  # fmt: skip


def test_a_later_steps_answers_wait_for_it_and_strays_are_dropped() -> None:
    queue = ResponseQueue([
        _answer("b_0", 0.5), _answer("late_9", 1.0), "{not json", _answer("a_0", 0.25),
        _answer("a_1", 0.75),
    ])  # fmt: skip
    inbox = RolloutInbox(queue, URL)
    inbox.expect(["a_0", "a_1"])  # step 1
    inbox.expect(["b_0"])  # step 2, sent before step 1 trained
    forever = {"deadline": float("inf"), "clock": lambda: 0.0, "stopped": lambda: False}
    first = inbox.collect({"a_0", "a_1"}, **forever)
    assert {sample: r.aggregate_score for sample, r in first.items()} == {"a_0": 0.25, "a_1": 0.75}
    assert queue.deleted == ["0", "1", "2", "3", "4"]  # read once, the stray and the malformed too
    receives = queue.receives
    second = inbox.collect({"b_0"}, **forever)
    assert list(second) == ["b_0"] and second["b_0"].aggregate_score == 0.5
    assert queue.receives == receives  # it was already in


def test_an_answer_after_its_step_was_collected_is_late_and_dropped() -> None:
    queue = ResponseQueue([_answer("a_0", 0.25)])
    inbox = RolloutInbox(queue, URL)
    inbox.expect(["a_0", "a_1"])
    ticks = iter(range(100))
    got = inbox.collect(
        {"a_0", "a_1"}, deadline=3, clock=lambda: next(ticks), stopped=lambda: False
    )
    assert list(got) == ["a_0"]  # a_1 never came before the deadline
    queue.messages = [{"Body": _answer("a_1", 1.0), "ReceiptHandle": "late"}]
    inbox.expect(["c_0"])
    queue.messages.append({"Body": _answer("c_0", 0.0), "ReceiptHandle": "c"})
    assert list(inbox.collect({"c_0"}, deadline=3, clock=lambda: 0, stopped=lambda: False)) == [
        "c_0"
    ]
    assert inbox.collect({"a_1"}, deadline=0, clock=lambda: 0, stopped=lambda: False) == {}
