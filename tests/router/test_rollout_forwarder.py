"""The rollout Lambda: a Nova trainer's rollout requests reach the run whose alias it invoked,
once, as valid v0, each sample marked with the phase the alias is for; anything else is refused
with the reason, and nothing is sent."""

from __future__ import annotations

import hashlib
import json
from types import SimpleNamespace
from typing import Any

import boto3
import pytest

from domain.episodes import EvaluationStage
from domain.protocol import ProtocolError, RolloutRequest, parse
from lambdas.router import rollout_forwarder
from lambdas.router.rollout_aliases import (
    Invoked,
    alias_name,
    create_rollout_aliases,
    delete_rollout_aliases,
    evaluation_alias_arn,
    rollout_aliases_left,
    run_of,
)
from lambdas.router.rollout_forwarder import RolloutForwarder, RolloutRefused, forwarder_for
from tests.aws import create_router_functions
from tests.router.conftest import OTHER_RUN, RUN, TABLE, Router
from tests.router.test_nova_contract import DOCUMENTED_ROLLOUT_REQUEST

FUNCTION = "arn:aws:lambda:us-east-1:123456789012:function:nova-mtrl-rollout"


def forwarder(router: Router) -> RolloutForwarder:
    # The conftest's queues' prefix.
    return RolloutForwarder(router.sqs, router.store, prefix="test", clock=router.clock)


def invoke(forwarder: RolloutForwarder, request: Any, alias: str | None = RUN) -> dict[str, Any]:
    arn = f"{FUNCTION}:{alias}" if alias is not None else FUNCTION
    return forwarder.handle({"request": request, "invoked_function_arn": arn})


def test_a_documented_request_lands_on_the_invoking_runs_queue_once(router: Router) -> None:
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
    sent = forwarder(router)
    invoke(sent, DOCUMENTED_ROLLOUT_REQUEST)
    invoke(sent, {**DOCUMENTED_ROLLOUT_REQUEST, "timestamp": "2025-10-28T12:05:00Z"})
    assert len(router.messages(router.queues.rollout_requests)) == 2


def test_runs_never_mix_each_gets_what_its_own_alias_was_sent(router: Router) -> None:
    sent = forwarder(router)
    invoke(sent, {**DOCUMENTED_ROLLOUT_REQUEST, "sample_id": "mine_0"}, alias=RUN)
    invoke(sent, {**DOCUMENTED_ROLLOUT_REQUEST, "sample_id": "theirs_0"}, alias=OTHER_RUN)
    mine = router.messages(router.queues.rollout_requests)
    theirs = router.messages(router.other_queues.rollout_requests)
    assert [parse(RolloutRequest, m["Body"]).sample_id for m in mine] == ["mine_0"]
    assert [parse(RolloutRequest, m["Body"]).sample_id for m in theirs] == ["theirs_0"]


@pytest.mark.parametrize(
    ("alias", "message"),
    [
        (None, f"invoked as {FUNCTION}: invoke the run's alias"),
        ("$LATEST", f"invoked as {FUNCTION}:$LATEST: invoke the run's alias"),
        ("7", f"invoked as {FUNCTION}:7: invoke the run's alias"),  # a version, not an alias
        ("gone-run", "run 'gone-run' has no rollout-request queue (test-run-gone-run-rollout-"),
    ],
)
def test_an_invocation_outside_a_live_runs_alias_is_refused(
    router: Router, alias: str | None, message: str
) -> None:
    sent = forwarder(router)
    for _ in range(2):
        with pytest.raises(RolloutRefused) as refused:
            invoke(sent, DOCUMENTED_ROLLOUT_REQUEST, alias=alias)
        assert str(refused.value).startswith(message)
    assert sent.counters.refused == 2 and sent.counters.forwarded == 0
    assert not router.messages(router.queues.rollout_requests)


def test_refusals_say_what_to_invoke_and_why_a_run_cannot_be_reached(router: Router) -> None:
    with pytest.raises(RolloutRefused) as bare:
        invoke(forwarder(router), DOCUMENTED_ROLLOUT_REQUEST, alias=None)
    assert str(bare.value) == (
        f"invoked as {FUNCTION}: invoke the run's alias (<function ARN>:<run id>"
        "[_<evaluation>]), the rollout_request_arn its recipe names"
    )
    with pytest.raises(RolloutRefused) as gone:
        invoke(forwarder(router), DOCUMENTED_ROLLOUT_REQUEST, alias="gone-run")
    assert str(gone.value) == (
        "run 'gone-run' has no rollout-request queue (test-run-gone-run-rollout-requests.fifo): it "
        "was never provisioned or is torn down"
    )


def test_a_function_with_its_environment_forwards_to_that_deployments_queues(
    router: Router,
) -> None:
    clients = {"sqs": router.sqs, "dynamodb": router.db}
    made = forwarder_for({"NAME_PREFIX": "test", "TABLE_NAME": TABLE}, clients.__getitem__)
    invoke(made, DOCUMENTED_ROLLOUT_REQUEST, alias=f"{RUN}_final")
    assert len(router.messages(router.queues.rollout_requests)) == 1
    assert router.store.sample_phase(RUN, "sample-000_0") == "final"


def test_each_sample_is_kept_in_the_phase_its_alias_is_for(router: Router) -> None:
    """Baseline, training and final ask in turn, the same sample id too: the phase recorded is
    the last one asked in, before the request is queued."""
    sent = forwarder(router)
    asked = {**DOCUMENTED_ROLLOUT_REQUEST, "sample_id": "a_0"}
    assert invoke(sent, asked, alias=f"{RUN}_baseline")["stage"] == "baseline"
    assert router.store.sample_phase(RUN, "a_0") == "baseline"
    invoke(sent, {**asked, "timestamp": 2.0})
    assert router.store.sample_phase(RUN, "a_0") == "training"
    invoke(sent, {**asked, "timestamp": 3.0}, alias=f"{RUN}_final")
    assert router.store.sample_phase(RUN, "a_0") == "final"
    assert router.store.sample_phase(OTHER_RUN, "a_0") is None
    assert len(router.messages(router.queues.rollout_requests)) == 3


def test_an_alias_of_no_phase_is_refused_and_nothing_is_recorded(router: Router) -> None:
    sent = forwarder(router)
    with pytest.raises(RolloutRefused, match="invoke the run's alias"):
        invoke(sent, DOCUMENTED_ROLLOUT_REQUEST, alias=f"{RUN}_midway")
    assert router.store.sample_phase(RUN, "sample-000_0") is None
    assert not router.messages(router.queues.rollout_requests)
    assert sent.counters.refused == 1


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
    sent = forwarder(router)
    for _ in range(2):
        with pytest.raises(ProtocolError, match="^RolloutRequest: ") as refused:
            invoke(sent, request_body)
        assert message in str(refused.value)
    assert sent.counters.malformed == 2
    assert not router.messages(router.queues.rollout_requests)


def test_the_lambda_entry_reads_the_run_from_the_arn_it_was_invoked_by(monkeypatch) -> None:
    seen: list[Any] = []
    monkeypatch.setattr(rollout_forwarder, "_forward", lambda event, context: seen.append(event))
    context = SimpleNamespace(invoked_function_arn=f"{FUNCTION}:{RUN}")
    rollout_forwarder.handler(DOCUMENTED_ROLLOUT_REQUEST, context)
    assert seen == [
        {"request": DOCUMENTED_ROLLOUT_REQUEST, "invoked_function_arn": f"{FUNCTION}:{RUN}"}
    ]


def test_run_ids_and_alias_names_are_one_and_the_same() -> None:
    run = "wordle-3f2a9c01d4"
    assert run_of(f"{FUNCTION}:{alias_name(run)}") == Invoked(run)
    for stage in EvaluationStage:
        assert run_of(f"{FUNCTION}:{alias_name(run, stage)}") == Invoked(run, stage)
        assert evaluation_alias_arn(f"{FUNCTION}:{run}", stage) == f"{FUNCTION}:{run}_{stage}"
    for bad in ("", "123", "has space", "x" * 129, "dot.ted", "under_score"):
        with pytest.raises(ValueError, match="cannot name a Lambda alias"):
            alias_name(bad)
    assert run_of("arn:aws:lambda:us-east-1:1:function:f:a:b") is None
    assert run_of(f"{FUNCTION}:{run}_") is None
    long = "a" * 120  # an alias by itself, not with `_baseline` (129 characters)
    assert alias_name(long) == long
    with pytest.raises(ValueError, match="cannot name a Lambda alias"):
        alias_name(long, EvaluationStage.BASELINE)


def test_a_runs_aliases_are_created_once_and_deleted_once(aws: None) -> None:
    client = boto3.client("lambda")
    _, function = create_router_functions(client, boto3.client("iam"))
    arn = create_rollout_aliases(client, function=function, run_id="r-1")
    assert create_rollout_aliases(client, function=function, run_id="r-1") == arn
    assert arn.endswith(f":function:{function}:r-1")
    aliases = {a["Name"]: a for a in client.list_aliases(FunctionName=function)["Aliases"]}
    assert sorted(aliases) == ["r-1", "r-1_baseline", "r-1_final"]
    assert aliases["r-1"]["Description"] == "nova-mtrl run r-1: its rollout_request_arn"
    assert aliases["r-1_final"]["Description"] == (
        "nova-mtrl run r-1: its rollout_request_arn for its final evaluation"
    )
    assert aliases["r-1_final"]["AliasArn"] == evaluation_alias_arn(arn, EvaluationStage.FINAL)
    assert rollout_aliases_left(client, function=function, run_id="r-1") == 3
    client.delete_alias(FunctionName=function, Name="r-1")  # a teardown cut short: each counts
    assert rollout_aliases_left(client, function=function, run_id="r-1") == 2
    delete_rollout_aliases(client, function=function, run_id="r-1")
    assert rollout_aliases_left(client, function=function, run_id="r-1") == 0
    assert [a["Name"] for a in client.list_aliases(FunctionName=function)["Aliases"]] == []
    # Lambda answers a gone alias with ResourceNotFoundException (botocore's DeleteAlias errors).
    gone = Gone(client)
    delete_rollout_aliases(gone, function=function, run_id="r-1")
    assert gone.asked == ["r-1", "r-1_baseline", "r-1_final"]


class Gone:
    """Lambda for an alias that is not there: DeleteAlias raises as the real API may."""

    def __init__(self, client: Any) -> None:
        self.exceptions, self.asked = client.exceptions, []

    def delete_alias(self, *, FunctionName: str, Name: str) -> None:  # noqa: N803 - boto3's
        self.asked.append(Name)
        raise self.exceptions.ResourceNotFoundException(
            {"Error": {"Code": "ResourceNotFoundException", "Message": "no alias"}}, "DeleteAlias"
        )
