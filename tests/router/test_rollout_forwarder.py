"""The rollout Lambda: a Nova trainer invokes the function itself, unqualified (as AWS's Forge
SDK passes it); its requests reach the one run that holds it, once, as valid v0, each sample
marked with the phase that run has open; anything else is refused with the reason, and nothing
is sent. The lease that says which run it serves is taken by one run at a time."""

from __future__ import annotations

import hashlib
import json
from types import SimpleNamespace
from typing import Any

import pytest

from domain.episodes import EvaluationStage, phase_of
from domain.protocol import ProtocolError, RolloutRequest, parse
from lambdas.router import rollout_forwarder
from lambdas.router.conversations import REGISTRATION_GRACE_SECONDS, RolloutLambdaHeld
from lambdas.router.rollout_forwarder import RolloutForwarder, RolloutRefused, forwarder_for
from tests.router.conftest import OTHER_RUN, RUN, TABLE, Router
from tests.router.test_nova_contract import DOCUMENTED_ROLLOUT_REQUEST

DEADLINE_IN = 3600.0  # the holder's deadline, from the router's clock


def forwarder(router: Router) -> RolloutForwarder:
    # The conftest's queues' prefix.
    return RolloutForwarder(router.sqs, router.store, prefix="test", clock=router.clock)


def serving(router: Router, run: str = RUN, stage: EvaluationStage | None = None) -> None:
    """`run` holds the rollout Lambda (as Provision makes it) with `stage`'s phase open."""
    router.store.hold_rollout_lambda(
        run, deadline_at=router.clock() + DEADLINE_IN, now=router.clock()
    )
    router.store.open_phase(run, phase_of(stage), now=router.clock())


def invoke(forwarder: RolloutForwarder, request: Any) -> dict[str, Any]:
    return forwarder.handle(request)


def test_a_documented_request_lands_on_the_holding_runs_queue_once(router: Router) -> None:
    serving(router)
    sent = forwarder(router)
    assert invoke(sent, DOCUMENTED_ROLLOUT_REQUEST) == {
        "run_id": RUN,
        "sample_id": "sample-000_0",
        "stage": None,
        "forwarded": True,
    }
    invoke(sent, DOCUMENTED_ROLLOUT_REQUEST)  # the trainer's retry of the same invocation
    (message,) = router.messages(router.queues.rollout_requests)
    assert parse(RolloutRequest, message["Body"]) == parse(
        RolloutRequest, json.dumps(DOCUMENTED_ROLLOUT_REQUEST)
    )
    attributes = message["Attributes"]
    assert attributes["MessageGroupId"] == "sample-000_0"
    digest = hashlib.sha256(json.dumps(DOCUMENTED_ROLLOUT_REQUEST).encode()).hexdigest()
    assert attributes["MessageDeduplicationId"] == digest
    assert not router.messages(router.other_queues.rollout_requests)
    assert (sent.counters.forwarded, sent.counters.malformed, sent.counters.refused) == (2, 0, 0)


def test_the_same_sample_asked_again_later_is_a_new_request(router: Router) -> None:
    serving(router)
    sent = forwarder(router)
    invoke(sent, DOCUMENTED_ROLLOUT_REQUEST)
    invoke(sent, {**DOCUMENTED_ROLLOUT_REQUEST, "timestamp": "2025-10-28T12:05:00Z"})
    assert len(router.messages(router.queues.rollout_requests)) == 2


def test_runs_never_mix_the_lambda_serves_one_run_until_it_lets_go(router: Router) -> None:
    serving(router)
    sent = forwarder(router)
    with pytest.raises(RolloutLambdaHeld) as held:
        serving(router, OTHER_RUN)
    assert str(held.value).startswith(
        f"run {OTHER_RUN}: the deployment's rollout Lambda serves run {RUN}'s Nova jobs until "
        "that run is torn down (at the latest 2027-01-15 10:00 UTC)"
    )
    assert held.value.holder == RUN
    assert str(held.value).endswith(
        "upload this run again once that one has ended, or deploy a second platform "
        "(another name_prefix) for Nova runs side by side"
    )
    serving(router)  # its own lease again (a retried Provision): still its own
    router.store.release_rollout_lambda(OTHER_RUN)  # not the holder: nothing changes
    invoke(sent, {**DOCUMENTED_ROLLOUT_REQUEST, "sample_id": "mine_0"})
    router.store.release_rollout_lambda(RUN)
    serving(router, OTHER_RUN)
    invoke(sent, {**DOCUMENTED_ROLLOUT_REQUEST, "sample_id": "theirs_0"})
    mine = router.messages(router.queues.rollout_requests)
    theirs = router.messages(router.other_queues.rollout_requests)
    assert [parse(RolloutRequest, m["Body"]).sample_id for m in mine] == ["mine_0"]
    assert [parse(RolloutRequest, m["Body"]).sample_id for m in theirs] == ["theirs_0"]


def test_a_lease_left_behind_expires_with_its_runs_registration(router: Router) -> None:
    """A run whose teardown never released it: once its registration would have expired, no
    request reaches it, and another run may take the Lambda."""
    serving(router)
    router.clock.now += DEADLINE_IN + REGISTRATION_GRACE_SECONDS + 1
    with pytest.raises(RolloutRefused, match="^no Nova run is served by this rollout Lambda"):
        invoke(forwarder(router), DOCUMENTED_ROLLOUT_REQUEST)
    serving(router, OTHER_RUN)
    assert invoke(forwarder(router), DOCUMENTED_ROLLOUT_REQUEST)["run_id"] == OTHER_RUN


def test_refusals_say_why_no_run_can_be_reached(router: Router) -> None:
    sent = forwarder(router)
    with pytest.raises(RolloutRefused) as none:
        invoke(sent, DOCUMENTED_ROLLOUT_REQUEST)
    assert str(none.value) == (
        "no Nova run is served by this rollout Lambda now: none holds it (none was provisioned, "
        "or its run is torn down)"
    )
    router.store.hold_rollout_lambda(RUN, deadline_at=router.clock() + 60, now=router.clock())
    with pytest.raises(RolloutRefused) as unopened:
        invoke(sent, DOCUMENTED_ROLLOUT_REQUEST)
    assert str(unopened.value) == f"run {RUN!r} has opened no phase yet: no job of it has started"
    router.store.release_rollout_lambda(RUN)
    router.store.put_run("gone-run", token="t", queues={}, model="m", now=router.clock())
    serving(router, "gone-run")
    with pytest.raises(RolloutRefused) as gone:
        invoke(sent, DOCUMENTED_ROLLOUT_REQUEST)
    assert str(gone.value) == (
        "run 'gone-run' has no rollout-request queue (test-run-gone-run-rollout-requests.fifo): it "
        "was never provisioned or is torn down"
    )
    assert sent.counters.refused == 3 and sent.counters.forwarded == 0
    assert router.store.sample_phase(RUN, "sample-000_0") is None
    assert not router.messages(router.queues.rollout_requests)


def test_a_function_with_its_environment_forwards_to_that_deployments_queues(
    router: Router,
) -> None:
    serving(router, stage=EvaluationStage.FINAL)
    clients = {"sqs": router.sqs, "dynamodb": router.db}
    made = forwarder_for(
        {"NAME_PREFIX": "test", "TABLE_NAME": TABLE}, clients.__getitem__, RolloutForwarder
    )
    invoke(made, DOCUMENTED_ROLLOUT_REQUEST)
    assert len(router.messages(router.queues.rollout_requests)) == 1
    assert router.store.sample_phase(RUN, "sample-000_0") == "final"


def test_each_sample_is_kept_in_the_phase_open_when_it_was_asked_for(router: Router) -> None:
    """Baseline, training and final ask in turn, the same sample id too: the phase recorded is
    the last one asked in, before the request is queued."""
    sent = forwarder(router)
    asked = {**DOCUMENTED_ROLLOUT_REQUEST, "sample_id": "a_0"}
    serving(router, stage=EvaluationStage.BASELINE)
    assert invoke(sent, asked)["stage"] == "baseline"
    assert router.store.sample_phase(RUN, "a_0") == "baseline"
    router.store.open_phase(RUN, "training", now=router.clock())
    invoke(sent, {**asked, "timestamp": 2.0})
    assert router.store.sample_phase(RUN, "a_0") == "training"
    router.store.open_phase(RUN, "final", now=router.clock())
    assert invoke(sent, {**asked, "timestamp": 3.0})["stage"] == "final"
    assert router.store.sample_phase(RUN, "a_0") == "final"
    assert router.store.sample_phase(OTHER_RUN, "a_0") is None
    assert len(router.messages(router.queues.rollout_requests)) == 3


@pytest.mark.parametrize(
    ("request_body", "message"),
    [
        ({**DOCUMENTED_ROLLOUT_REQUEST, "version": "v1"}, "unsupported version 'v1'"),
        (
            {k: v for k, v in DOCUMENTED_ROLLOUT_REQUEST.items() if k != "sample_id"},
            "sample_id: Field required",
        ),
        (
            {**DOCUMENTED_ROLLOUT_REQUEST, "data": {"level": 3}},
            "data: Value error, data needs at least one of prompt, problem or answer",
        ),
        ("not json", "not JSON"),
        ([1, 2], "expected a JSON object, got list"),
    ],
)
def test_a_request_that_is_not_v0_is_refused_with_what_is_wrong(
    router: Router, request_body: Any, message: str
) -> None:
    serving(router)
    sent = forwarder(router)
    for _ in range(2):
        with pytest.raises(ProtocolError, match="^RolloutRequest: ") as refused:
            invoke(sent, request_body)
        assert message in str(refused.value)
    assert sent.counters.malformed == 2
    assert not router.messages(router.queues.rollout_requests)


def test_the_lambda_entry_forwards_the_request_it_was_invoked_with(monkeypatch) -> None:
    seen: list[Any] = []
    monkeypatch.setattr(rollout_forwarder, "_forward", lambda event, context: seen.append(event))
    context = SimpleNamespace(invoked_function_arn="arn:aws:lambda:us-east-1:1:function:f")
    rollout_forwarder.handler(DOCUMENTED_ROLLOUT_REQUEST, context)
    assert seen == [DOCUMENTED_ROLLOUT_REQUEST]
