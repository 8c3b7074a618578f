"""The proxy handler: routes, isolation, limits, idempotent turns, reports."""

from __future__ import annotations

import json
import re

import pytest

from domain.protocol import GenerateRequest, RolloutResponse, parse, step_id_for
from tests.router.conftest import OTHER_TOKEN, RUN, Router, answer, event

CHAT = "/v1/chat/completions"
MESSAGES = [{"role": "user", "content": "Let's play. Guess 1 of 6:"}]


def chat(router: Router, messages=MESSAGES, sample="s1_0", **kwargs) -> tuple[int, dict]:
    return answer(
        router.proxy.handle(event("POST", CHAT, {"messages": messages}, sample=sample, **kwargs))
    )


def test_chat_enqueues_one_generate_request_and_returns_a_step_to_poll(router: Router) -> None:
    status, body = chat(router)
    assert (status, body) == (202, {"step_id": "s1_0_1", "status": "processing", "result": None})
    (message,) = router.messages(router.queues.generate_requests)
    request = parse(GenerateRequest, message["Body"])
    assert (request.sample_id, request.step_id, request.messages[0].content) == (
        "s1_0",
        "s1_0_1",
        MESSAGES[0]["content"],
    )
    assert message["Attributes"]["MessageGroupId"] == "s1_0"
    assert message["Attributes"]["MessageDeduplicationId"] == "s1_0_1"


def test_a_sample_id_sqs_would_refuse_still_makes_a_valid_step_and_message(router: Router) -> None:
    """128 characters with spaces: its step id stays within 128 and unique, and the group and
    deduplication ids SQS sees are ones SQS takes (1-128 alphanumerics and punctuation)."""
    sample = "rec " + "x" * 122 + "_0"
    status, body = chat(router, sample=sample)
    assert status == 202 and len(body["step_id"]) <= 128 and body["step_id"].endswith("_1")
    assert body["step_id"] != step_id_for("rec " + "x" * 122 + "_1", 1)
    (message,) = router.messages(router.queues.generate_requests)
    assert parse(GenerateRequest, message["Body"]).sample_id == sample
    for key in ("MessageGroupId", "MessageDeduplicationId"):
        assert re.fullmatch(r"[!-~]{1,128}", message["Attributes"][key])


def test_a_retried_chat_is_the_same_step_and_is_not_enqueued_again(router: Router) -> None:
    chat(router)
    status, body = chat(router)
    assert status == 202 and body["step_id"] == "s1_0_1"
    assert len(router.messages(router.queues.generate_requests)) == 1
    assert router.proxy.counters.retried_steps == 1


def test_later_turns_are_numbered_by_the_assistant_messages(router: Router) -> None:
    history = [
        *MESSAGES,
        {"role": "assistant", "content": "[crane]"},
        {"role": "user", "content": "CRANE: X X X X X"},
    ]
    assert chat(router, history)[1]["step_id"] == "s1_0_2"


def test_chat_returns_the_completion_when_it_arrives_within_the_wait(router: Router) -> None:
    router.proxy.wait_seconds = 3
    completion = {
        "choices": [
            {"message": {"role": "assistant", "content": "[crane]"}, "finish_reason": "stop"}
        ]
    }
    original = router.clock.sleep

    def sleep_then_complete(seconds: float) -> None:
        original(seconds)
        router.store.complete_step(RUN, "s1_0_1", completion, now=router.clock())

    router.proxy.sleep = sleep_then_complete
    status, body = chat(router)
    assert status == 200
    assert body["id"] == "s1_0_1" and body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["content"] == "[crane]"


def test_status_of_a_step(router: Router) -> None:
    chat(router)
    status, body = answer(router.proxy.handle(event("GET", f"{CHAT}/s1_0_1")))
    assert (status, body["status"], body["result"]) == (200, "processing", None)
    router.store.complete_step(
        RUN,
        "s1_0_1",
        {"choices": [{"message": {"role": "assistant", "content": "x"}}]},
        now=router.clock(),
    )
    status, body = answer(router.proxy.handle(event("GET", f"{CHAT}/s1_0_1")))
    assert (
        body["status"] == "completed" and body["result"]["choices"][0]["message"]["content"] == "x"
    )


def test_a_run_cannot_read_another_runs_step(router: Router) -> None:
    chat(router)
    status, body = answer(
        router.proxy.handle(event("GET", f"{CHAT}/s1_0_1", run="run-2", token=OTHER_TOKEN))
    )
    assert status == 404 and "no step 's1_0_1' in run 'run-2'" in body["error"]["message"]


@pytest.mark.parametrize(
    ("request_event", "status", "fragment"),
    [
        (event("POST", CHAT, {"messages": MESSAGES}, sample="s", signed=False), 401, "SigV4"),
        (event("POST", CHAT, {"messages": MESSAGES}, sample="s", run=None), 400, "x-mtrl-run-id"),
        (
            event("POST", CHAT, {"messages": MESSAGES}, sample="s", token="wrong"),
            403,
            "not allowed for run 'run-1'",
        ),
        (
            event("POST", CHAT, {"messages": MESSAGES}, sample="s", token=OTHER_TOKEN),
            403,
            "x-mtrl-run-token",
        ),
        (event("POST", CHAT, {"messages": MESSAGES}, sample="s", run="nope"), 403, "'nope'"),
        (event("POST", CHAT, {"messages": MESSAGES}), 400, "x-mtrl-sample-id"),
        (event("POST", CHAT, "{not json", sample="s"), 400, "Invalid JSON"),
        (event("POST", CHAT, {"messages": []}, sample="s"), 400, "messages"),
        (
            event("POST", CHAT, {"messages": [{"role": "robot", "content": "hi"}]}, sample="s"),
            400,
            "messages.0.role",
        ),
        (
            event(
                "POST", CHAT, {"messages": [{"role": "user", "content": "x" * 300_000}]}, sample="s"
            ),
            413,
            "exceeds",
        ),
        (event("DELETE", CHAT), 405, "DELETE is not allowed"),
        (event("GET", "/v2/other"), 404, "no route"),
        ({"nonsense": True}, 400, "not a Function URL event"),
    ],
)
def test_bad_requests_get_clear_4xx_errors(
    router: Router, request_event: dict, status: int, fragment: str
) -> None:
    got, body = answer(router.proxy.handle(request_event))
    assert got == status and fragment in body["error"]["message"], body
    assert not router.messages(router.queues.generate_requests)


def test_report_forwards_one_rollout_response(router: Router) -> None:
    report = {
        "id": "s1_0",
        "aggregate_reward_score": 0.8,
        "metrics_list": [{"name": "turns", "value": 3}],
    }
    headers = {"x-mtrl-request-id": "req-msg-1"}
    first = answer(
        router.proxy.handle(event("POST", "/v1/rollouts/report", report, headers=headers))
    )
    again = answer(
        router.proxy.handle(event("POST", "/v1/rollouts/report", report, headers=headers))
    )
    assert first == (200, {"id": "s1_0", "recorded": True}) and again == (
        200,
        {"id": "s1_0", "recorded": False},
    )
    (message,) = router.messages(router.queues.rollout_responses)
    response = parse(RolloutResponse, message["Body"])
    assert response.aggregate_score == 0.8 and response.metrics[0].name == "turns"
    assert (
        router.store.run_summary(RUN, now=router.clock(), stuck_after_seconds=60)["finished"] == 1
    )


def test_a_report_without_a_score_must_say_why(router: Router) -> None:
    status, body = answer(
        router.proxy.handle(
            event("POST", "/v1/rollouts/report", {"id": "s", "aggregate_reward_score": None})
        )
    )
    assert status == 400 and "aggregate_score" in body["error"]["message"]
    failed = {
        "id": "s",
        "aggregate_reward_score": None,
        "stop_reason": "env_error",
        "error": "boom",
    }
    assert answer(router.proxy.handle(event("POST", "/v1/rollouts/report", failed)))[0] == 200
    assert (
        json.loads(router.messages(router.queues.rollout_responses)[0]["Body"])["stop_reason"]
        == "env_error"
    )
