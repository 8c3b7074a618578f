"""Conversation state: conditional writes, run tokens, queue ownership, run summaries."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from lambdas.router import conversations
from tests.router.conftest import OTHER_RUN, RUN, TOKEN, Router


def test_a_step_is_recorded_once(router: Router) -> None:
    store, now = router.store, router.clock()
    assert store.start_step(RUN, "s_1", sample_id="s", now=now) is True
    assert store.start_step(RUN, "s_1", sample_id="s", now=now + 1) is False
    step = store.get_step(RUN, "s_1")
    assert (step.status, step.sample_id, step.created_at) == ("pending", "s", now)


def test_a_completion_is_written_once_and_never_overwritten(router: Router) -> None:
    store, now = router.store, router.clock()
    store.start_step(RUN, "s_1", sample_id="s", now=now)
    first = {"choices": [{"message": {"role": "assistant", "content": "[crane]"}}]}
    assert store.complete_step(RUN, "s_1", first, now=now + 1) == "completed"
    second = {"choices": [{"message": {"role": "assistant", "content": "[slate]"}}]}
    assert store.complete_step(RUN, "s_1", second, now=now + 2) == "duplicate"
    assert store.get_step(RUN, "s_1").result == first
    assert store.complete_step(RUN, "never_1", first, now=now) == "unknown"
    assert store.get_step(RUN, "never_1") is None


def test_steps_belong_to_their_run(router: Router) -> None:
    router.store.start_step(RUN, "s_1", sample_id="s", now=router.clock())
    assert router.store.get_step(OTHER_RUN, "s_1") is None


def test_run_token_is_checked_by_hash(router: Router, monkeypatch: pytest.MonkeyPatch) -> None:
    """The docs' claim: kept only as a SHA-256, compared in constant time."""
    run = router.store.get_run(RUN)
    now = 0.0
    compared, constant_time = [], hmac.compare_digest

    def compare_digest(a: str, b: str) -> bool:
        compared.append((a, b))
        return constant_time(a, b)

    monkeypatch.setattr(conversations.hmac, "compare_digest", compare_digest)
    assert run.accepts(TOKEN, now=now) and not run.accepts("secret-token-2", now=now)
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    assert compared == [(digest, digest), (digest, hashlib.sha256(b"secret-token-2").hexdigest())]
    assert not run.accepts(None, now=now)
    item = router.db.get_item(
        TableName="conversations", Key={"run_id": {"S": RUN}, "item": {"S": "run"}}
    )["Item"]
    assert item["token_sha256"] == {"S": digest}
    assert TOKEN not in str(item)
    assert router.store.get_run("no-such-run") is None


def test_queues_map_back_to_their_run(router: Router) -> None:
    assert router.store.run_of_queue(router.queues.generate_responses) == RUN
    assert (
        router.store.run_of_queue(router.queue_arn(router.other_queues.generate_responses))
        == OTHER_RUN
    )
    assert router.store.run_of_queue("arn:aws:sqs:us-east-1:123456789012:stranger.fifo") is None


def test_rollouts_finish_once_and_summaries_count_them(router: Router) -> None:
    store, now = router.store, router.clock()
    for sample in ("a", "b", "c", "d"):
        assert store.begin_rollout(RUN, sample, now=now)
    assert store.begin_rollout(RUN, "a", now=now) is False  # already in flight
    assert store.finish_rollout(RUN, "a", failed=False, score=0.9, now=now + 5) is True
    assert store.finish_rollout(RUN, "a", failed=False, score=0.1, now=now + 6) is False
    assert store.finish_rollout(RUN, "b", failed=True, score=None, now=now + 5) is True
    assert (
        store.finish_rollout(RUN, "external", failed=False, score=1.0, now=now) is True
    )  # never chatted
    summary = store.run_summary(RUN, now=now + 700, stuck_after_seconds=600)
    assert summary == {"in_flight": 2, "finished": 2, "failed": 1, "stuck": 2}
    assert (
        store.begin_rollout(RUN, "a", now=now + 800) is True
    )  # a new request for a finished sample
    assert store.run_summary(RUN, now=now + 800, stuck_after_seconds=600)["in_flight"] == 3
