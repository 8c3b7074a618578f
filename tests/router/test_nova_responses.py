"""What Nova's trainer is sent for a finished rollout: the documented rollout response and nothing
more (Amazon Nova user guide, "Reinforcement Learning", nova-hp-rft-forge, "BYOO request and
response formats": `version`, `sample_id`, `stop_reason` "end_of_conversation",
`rewards.aggregate_score`). A rollout that failed has no documented form, so nothing is sent for
it; the run's own records keep every report whole."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from domain.protocol import NovaRolloutResponse, RolloutResponse, parse
from tests.router.conftest import RUN, Router, answer, event
from tests.router.test_nova_contract import DOCUMENTED_ROLLOUT_REQUEST, DOCUMENTED_ROLLOUT_RESPONSE
from tests.router.test_rollout_forwarder import forwarder, invoke, serving

METRICS = [{"name": "turns", "value": 3.0, "type": "Metric"}]


def report(router: Router, sample: str, **fields: Any) -> tuple[int, dict]:
    body = {"id": sample, "request_id": f"req-{sample}", "metrics_list": METRICS, **fields}
    return answer(router.proxy.handle(event("POST", "/v1/rollouts/report", body)))


def sent_bodies(router: Router) -> list[dict[str, Any]]:
    return [json.loads(m["Body"]) for m in router.messages(router.queues.rollout_responses)]


def asked_by_nova(router: Router, sample: str) -> None:
    """Nova's training job asks for `sample` through the rollout Lambda the run holds."""
    serving(router)
    invoke(forwarder(router), {**DOCUMENTED_ROLLOUT_REQUEST, "sample_id": sample})


def test_the_documented_example_is_a_nova_response_and_nothing_else_is() -> None:
    assert parse(NovaRolloutResponse, json.dumps(DOCUMENTED_ROLLOUT_RESPONSE))
    undocumented = [
        {**DOCUMENTED_ROLLOUT_RESPONSE, "metrics": []},
        {**DOCUMENTED_ROLLOUT_RESPONSE, "error": None},
        {**DOCUMENTED_ROLLOUT_RESPONSE, "stop_reason": "max_turns"},
        {**DOCUMENTED_ROLLOUT_RESPONSE, "rewards": {"aggregate_score": None}},
        {**DOCUMENTED_ROLLOUT_RESPONSE, "rewards": {"aggregate_score": 1.0, "format": 1.0}},
    ]
    for message in undocumented:
        with pytest.raises(ValidationError):
            NovaRolloutResponse.model_validate(message)


@pytest.mark.parametrize("stop_reason", ["end_of_conversation", "max_turns"])
def test_nova_is_sent_exactly_the_documented_fields(router: Router, stop_reason: str) -> None:
    asked_by_nova(router, "sample-000_0")
    answered = report(router, "sample-000_0", aggregate_reward_score=0.85, stop_reason=stop_reason)
    assert answered == (200, {"id": "sample-000_0", "recorded": True, "sent": True})
    assert sent_bodies(router) == [DOCUMENTED_ROLLOUT_RESPONSE]
    (kept,) = router.store.reports(RUN, None)  # the run's record keeps what Nova is not sent
    assert (kept.episode.stop_reason, kept.episode.turns) == (stop_reason, 3.0)


@pytest.mark.parametrize("stop_reason", ["timeout", "env_error"])
def test_a_failed_rollout_of_novas_is_recorded_and_not_sent(router: Router, stop_reason) -> None:
    asked_by_nova(router, "sample-000_0")
    status, body = report(
        router,
        "sample-000_0",
        aggregate_reward_score=None,
        stop_reason=stop_reason,
        error="step 2: the environment raised",
    )
    assert (status, body) == (200, {"id": "sample-000_0", "recorded": True, "sent": False})
    assert sent_bodies(router) == []
    assert router.proxy.counters.unsent_reports == 1
    (kept,) = router.store.reports(RUN, None)
    assert kept.score is None
    assert kept.episode.error == "step 2: the environment raised"
    # A retry of the same report is a duplicate, and still sends nothing.
    again = report(router, "sample-000_0", aggregate_reward_score=None, stop_reason=stop_reason)
    assert again == (200, {"id": "sample-000_0", "recorded": False, "sent": False})
    assert sent_bodies(router) == []


def test_our_own_trainers_samples_get_the_whole_response(router: Router) -> None:
    """Samples queued by the open-weights or local trainer, not through the rollout Lambda, are
    answered with everything the trainer uses (metrics, the failure and its reason)."""
    report(router, "direct_0", aggregate_reward_score=None, stop_reason="env_error", error="boom")
    report(router, "direct_1", aggregate_reward_score=0.5, stop_reason="max_turns")
    sent = {
        body["sample_id"]: parse(RolloutResponse, json.dumps(body)) for body in sent_bodies(router)
    }
    assert (sent["direct_0"].stop_reason, sent["direct_0"].error) == ("env_error", "boom")
    assert sent["direct_1"].stop_reason == "max_turns"
    assert [m.name for m in sent["direct_1"].metrics] == ["turns"]
