"""A run's phases — baseline evaluation, training, final evaluation — never mix: once the pipeline
opens the next, nothing of the one before reaches the run's queues (the proxy's turns and
reports refuse it; the rollout Lambda asks every request in the open phase), and the queues are
emptied of what it already sent."""

from __future__ import annotations

import botocore.loaders
import pytest
from botocore.exceptions import ClientError

from domain.run_queues import KINDS, PURGE_SECONDS, QueueKind, purge_run_queues
from tests.router.conftest import RUN, Router, answer, event
from tests.router.test_nova_contract import DOCUMENTED_ROLLOUT_REQUEST
from tests.router.test_rollout_forwarder import forwarder, invoke

CHAT, REPORT = "/v1/chat/completions", "/v1/rollouts/report"
MESSAGES = [{"role": "user", "content": "Let's play. Guess 1 of 6:"}]


def asked(router: Router, sample: str) -> None:
    """The trainer of the open phase asks for `sample` through the rollout Lambda, which the run
    holds."""
    router.store.hold_rollout_lambda(RUN, deadline_at=router.clock() + 60, now=router.clock())
    invoke(forwarder(router), {**DOCUMENTED_ROLLOUT_REQUEST, "sample_id": sample})


def chat(router: Router, sample: str) -> tuple[int, dict]:
    return answer(router.proxy.handle(event("POST", CHAT, {"messages": MESSAGES}, sample=sample)))


def report(router: Router, sample: str) -> tuple[int, dict]:
    body = {"id": sample, "aggregate_reward_score": 1.0, "request_id": f"req-{sample}"}
    return answer(router.proxy.handle(event("POST", REPORT, body)))


def test_the_open_phase_is_the_last_one_opened(router: Router) -> None:
    assert router.store.phase(RUN) is None
    assert router.store.open_phase(RUN, "baseline", now=router.clock()) is None  # the first
    assert router.store.open_phase(RUN, "training", now=router.clock()) == "baseline"
    assert router.store.phase(RUN) == "training"
    assert router.store.get_run(RUN) is not None  # the registration is kept beside it


def test_a_sample_of_an_ended_phase_gets_no_turn_and_no_report(router: Router) -> None:
    router.store.open_phase(RUN, "baseline", now=router.clock())
    asked(router, "held_0")
    assert chat(router, "held_0")[0] == 202  # its own phase: served
    router.messages(router.queues.generate_requests)
    router.store.open_phase(RUN, "training", now=router.clock())

    status, body = chat(router, "held_0")
    assert status == 410 and body["error"]["type"] == "phase_closed"
    assert body["error"]["message"] == (
        f"sample 'held_0' was asked for in the baseline phase of run '{RUN}', which has ended "
        "(the training phase is open): its turns and report are no longer taken; drop the rollout"
    )
    assert report(router, "held_0")[0] == 410
    assert not router.messages(router.queues.generate_requests)
    assert not router.messages(router.queues.rollout_responses)
    assert router.store.reports(RUN, None) == []


def test_the_open_phases_samples_are_served_and_recorded_in_it(router: Router) -> None:
    router.store.open_phase(RUN, "final", now=router.clock())
    asked(router, "held_0")
    assert chat(router, "held_0")[0] == 202
    assert report(router, "held_0") == (200, {"id": "held_0", "recorded": True, "sent": True})
    assert len(router.messages(router.queues.rollout_responses)) == 1
    (kept,) = router.store.reports(RUN, "final")
    assert kept.score == 1.0


def test_a_sample_put_straight_on_the_queue_is_never_fenced(router: Router) -> None:
    """The open-weights trainer queues its requests itself: no phase is recorded for them."""
    router.store.open_phase(RUN, "final", now=router.clock())
    assert chat(router, "direct_0")[0] == 202
    assert report(router, "direct_0")[0] == 200


def test_a_purge_empties_the_runs_message_queues_and_keeps_its_dead_letters(
    router: Router,
) -> None:
    for kind in (*KINDS, QueueKind.DLQ):
        router.sqs.send_message(
            QueueUrl=router.queues.urls()[kind], MessageBody="{}", MessageGroupId="g",
            MessageDeduplicationId=kind,
        )  # fmt: skip
    received = router.sqs.receive_message(QueueUrl=router.queues.rollout_requests)
    assert received["Messages"]  # in flight with a worker: purged as well
    assert purge_run_queues(router.sqs, router.queues.urls()) == 4
    for kind in KINDS:
        assert not router.messages(router.queues.urls()[kind]), kind
    assert len(router.messages(router.queues.dlq)) == 1
    assert router.messages(router.other_queues.rollout_requests) == []


def test_a_queue_purged_within_the_minute_is_left_to_that_purge_other_errors_are_raised(
    router: Router,
) -> None:
    """moto answers a second purge within 60 s as SQS does (PurgeQueueInProgress)."""
    assert purge_run_queues(router.sqs, router.queues.urls()) == 4
    assert purge_run_queues(router.sqs, router.queues.urls()) == 0
    router.sqs.delete_queue(QueueUrl=router.other_queues.rollout_requests)
    with pytest.raises(ClientError, match="NonExistentQueue|QueueDoesNotExist"):
        purge_run_queues(router.sqs, router.other_queues.urls())


def test_the_wait_after_a_purge_is_the_one_sqs_documents() -> None:
    """botocore's SQS model, PurgeQueue: deletion "takes up to 60 seconds"."""
    model = botocore.loaders.Loader().load_service_model("sqs", "service-2")
    documentation = model["operations"]["PurgeQueue"]
    assert f"takes up to {PURGE_SECONDS} seconds" in documentation["documentation"]
    assert "PurgeQueueInProgress" in {error["shape"] for error in documentation["errors"]}
