"""The proxy handler: routes, isolation, limits, idempotent turns, reports."""

from __future__ import annotations

import base64
import json
import re

import boto3
import pytest

from domain.episodes import Episode, EvaluationStage
from domain.protocol import (
    ID_LENGTH,
    MAX_BODY_BYTES,
    GenerateRequest,
    RolloutResponse,
    fifo_id,
    parse,
    step_id_for,
)
from lambdas.clients import Clients
from lambdas.router.conversations import REGISTRATION_GRACE_SECONDS
from lambdas.router.proxy import RUN_CACHE_SECONDS, RUN_CACHE_SIZE, Proxy, proxy_for
from tests.router.conftest import MODEL, OTHER_TOKEN, RUN, TABLE, TOKEN, Router, answer, event

CHAT, REPORT = "/v1/chat/completions", "/v1/rollouts/report"
MESSAGES = [{"role": "user", "content": "Let's play. Guess 1 of 6:"}]


def chat(router: Router, messages=MESSAGES, sample="s1_0", **kwargs) -> tuple[int, dict]:
    return answer(
        router.proxy.handle(event("POST", CHAT, {"messages": messages}, sample=sample, **kwargs))
    )


def test_chat_enqueues_one_generate_request_and_returns_a_step_to_poll(router: Router) -> None:
    status, body = chat(router)
    assert (status, body) == (202, {"step_id": "s1_0_1", "status": "pending", "result": None})
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


def test_a_retried_chat_is_the_same_step_and_sqs_keeps_one_request_for_it(router: Router) -> None:
    """A pending step's retry sends its request again under the same deduplication id."""
    chat(router)
    for _ in range(2):
        status, body = chat(router)
        assert status == 202 and body["step_id"] == "s1_0_1"
    chat(router, sample="s2_0")
    assert len(router.messages(router.queues.generate_requests)) == 2
    assert (router.proxy.counters.retried_steps, router.proxy.counters.enqueued) == (2, 4)


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
    assert (status, body["status"], body["result"]) == (200, "pending", None)
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


AUTH, INVALID, NOT_FOUND = "auth_error", "invalid_request_error", "not_found"
SIGNED_CHAT = {"messages": MESSAGES}


@pytest.mark.parametrize(
    ("request_event", "status", "kind", "message"),
    [
        (
            event("POST", CHAT, SIGNED_CHAT, sample="s", signed=False),
            401,
            AUTH,
            "requests must be signed with AWS SigV4 (Function URL AWS_IAM auth)",
        ),
        (
            event("POST", CHAT, SIGNED_CHAT, sample="s", run=None),
            404,
            NOT_FOUND,
            "no route POST /v1/chat/completions: call under the run's base URL, "
            "<router URL>/runs/<run id>/<run token>",
        ),
        (
            event("POST", CHAT, SIGNED_CHAT, sample="s", run="run-1", token=None),
            403,  # the path reads as run "run-1" with token "v1"
            AUTH,
            "not allowed for run 'run-1': check the run id and token in the base URL",
        ),
        *(
            (
                event("POST", CHAT, SIGNED_CHAT, sample="s", run=run, token=token),
                403,
                AUTH,
                f"not allowed for run {run!r}: check the run id and token in the base URL",
            )
            for run, token in (
                ("run-1", "wrong"),
                ("run-1", OTHER_TOKEN),
                ("nope", OTHER_TOKEN),
            )
        ),
        (
            event("POST", CHAT, SIGNED_CHAT),
            400,
            INVALID,
            "name the sample in the body's sample_id (1-128 characters)",
        ),
        (
            event("POST", CHAT, SIGNED_CHAT, sample="s" * 129),
            400,
            INVALID,
            "name the sample in the body's sample_id (1-128 characters)",
        ),
        (
            event("POST", CHAT, "{not json", sample="s"),
            400,
            INVALID,
            re.compile(r"body: Invalid JSON: .*"),
        ),
        (event("POST", CHAT, "[]", sample="s"), 400, INVALID, "body: Input should be an object"),
        (event("POST", CHAT, None, sample="s"), 400, INVALID, "messages: Field required"),
        (
            event("POST", CHAT, {"messages": []}, sample="s"),
            400,
            INVALID,
            re.compile(r"messages: List should have at least 1 item .*"),
        ),
        (
            event("POST", CHAT, {"messages": [{"role": "robot", "content": "hi"}]}, sample="s"),
            400,
            INVALID,
            re.compile(r"messages\.0\.role: Input should be .*"),
        ),
        (event("DELETE", CHAT), 405, INVALID, "DELETE is not allowed on /v1/chat/completions"),
        (event("GET", CHAT), 405, INVALID, "GET is not allowed on /v1/chat/completions"),
        (
            event("POST", f"{CHAT}/s1_0_1"),
            405,
            INVALID,
            "POST is not allowed on /v1/chat/completions/s1_0_1",
        ),
        (event("GET", REPORT), 405, INVALID, "GET is not allowed on /v1/rollouts/report"),
        (
            event("GET", "/v2/other"),
            404,
            NOT_FOUND,
            "no route GET /v2/other: use /v1/chat/completions or /v1/rollouts/report",
        ),
        (
            event("GET", "/v1/chat"),
            404,
            NOT_FOUND,
            "no route GET /v1/chat: use /v1/chat/completions or /v1/rollouts/report",
        ),
        ({"nonsense": True}, 400, INVALID, "not a Function URL event"),
    ],
)
def test_bad_requests_get_clear_4xx_errors(
    router: Router, request_event: dict, status: int, kind: str, message: str | re.Pattern
) -> None:
    """Ours word for word; pydantic's (the field, then its own words) by pattern."""
    got, body = answer(router.proxy.handle(request_event))
    assert (got, body["error"]["type"], body["error"]["code"]) == (status, kind, status), body
    said = body["error"]["message"]
    assert message.fullmatch(said) if isinstance(message, re.Pattern) else said == message, said
    assert not router.messages(router.queues.generate_requests)
    assert router.proxy.counters.client_errors == 1 and router.proxy.counters.enqueued == 0


def test_report_forwards_one_rollout_response(router: Router) -> None:
    report = {
        "id": "s1_0",
        "aggregate_reward_score": 0.8,
        "metrics_list": [{"name": "turns", "value": 3}],
        "request_id": "req-msg-1",
    }
    first = answer(router.proxy.handle(event("POST", "/v1/rollouts/report", report)))
    again = answer(router.proxy.handle(event("POST", "/v1/rollouts/report", report)))
    assert first == (200, {"id": "s1_0", "recorded": True, "sent": True}) and again == (
        200,
        {"id": "s1_0", "recorded": False, "sent": True},  # SQS keeps one: the same request id
    )
    (message,) = router.messages(router.queues.rollout_responses)
    assert message["Attributes"]["MessageDeduplicationId"] == "req-msg-1"
    response = parse(RolloutResponse, message["Body"])
    assert response.aggregate_score == 0.8 and response.metrics[0].name == "turns"
    assert (
        router.store.run_summary(RUN, now=router.clock(), stuck_after_seconds=60)["finished"] == 1
    )


def test_each_accepted_report_is_kept_once_with_its_score_and_success_for_the_curve(
    router: Router,
) -> None:
    """What the run's reward curve is made of (lambdas/pipeline/reward_curve.py): a retried
    report — same request id, or same id without one — is kept once; the success flag is the
    environment's `env/success` metric, absent when the report has none."""
    won = {
        "id": "s1_0",
        "aggregate_reward_score": 0.9,
        "request_id": "z-1",
        "metrics_list": [{"name": "env/success", "value": 1.0}, {"name": "turns", "value": 3}],
    }
    lost = {
        "id": "s1_1",
        "aggregate_reward_score": 0.0,
        "request_id": "a-2",
        "metrics_list": [{"name": "env/success", "value": 0.0}],
    }
    plain = {"id": "s1_2", "aggregate_reward_score": 0.5}  # a starter-kit client: no request id
    failed = {"id": "s1_3", "aggregate_reward_score": None, "stop_reason": "timeout"}
    for report in (won, won, lost, plain, plain, failed):
        router.proxy.handle(event("POST", REPORT, report))
        router.clock.sleep(1)
    kept = [(r.key, r.reported_at, r.score, r.success) for r in router.store.reports(RUN)]
    start = router.clock() - 6
    assert kept == [  # in the order accepted, not the keys'
        ("report#z-1", start, 0.9, True), ("report#a-2", start + 2, 0.0, False),
        ("report#s1_2", start + 3, 0.5, None), ("report#s1_3", start + 5, None, None),
    ]  # fmt: skip
    assert router.store.reports("another-run") == []
    (episode,) = [r.episode for r in router.store.reports(RUN) if r.key == "report#z-1"]
    assert episode == Episode(
        record_id="s1", sample_id="s1_0", stop_reason="end_of_conversation", score=0.9,
        success=True, turns=3.0,
    )  # fmt: skip


def test_a_report_is_kept_in_the_phase_its_sample_was_asked_for_in(router: Router) -> None:
    """The forwarder marked the sample for an evaluation: its report stays out of the training
    curve and is found under that evaluation, as its episode; one asked for straight on the
    queue (no mark) is training's."""
    router.store.mark_sample(RUN, "e_0", stage=EvaluationStage.BASELINE, now=router.clock())
    for sample in ("e_0", "t_0"):
        report = {"id": sample, "aggregate_reward_score": 0.25, "stop_reason": "max_turns",
                  "metrics_list": [{"name": "env/invalid", "value": 2}]}  # fmt: skip
        assert answer(router.proxy.handle(event("POST", REPORT, report)))[0] == 200
    assert [r.key for r in router.store.reports(RUN)] == ["report#t_0"]
    assert router.store.reports(RUN, EvaluationStage.FINAL) == []
    (evaluated,) = router.store.reports(RUN, EvaluationStage.BASELINE)
    assert evaluated.episode == Episode(
        record_id="e", sample_id="e_0", stop_reason="max_turns", score=0.25, invalid_moves=2.0
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


def test_every_answer_is_json_and_only_4xx_count_as_client_errors(router: Router) -> None:
    answers = [
        router.proxy.handle(event("POST", CHAT, SIGNED_CHAT, sample="s1_0")),
        router.proxy.handle(event("GET", "/nowhere")),
        router.proxy.handle(event("POST", CHAT, SIGNED_CHAT, sample="s1_0", token="wrong")),
    ]
    router.store.set_step_status(RUN, "s1_0_1", "failed", expected="pending", now=0)
    answers.append(router.proxy.handle(event("POST", CHAT, SIGNED_CHAT, sample="s1_0")))
    assert [result["statusCode"] for result in answers] == [202, 404, 403, 502]
    assert all(result["headers"] == {"content-type": "application/json"} for result in answers)
    assert answer(answers[-1])[1] == {
        "error": {
            "message": "generation of step s1_0_1 failed",
            "type": "generation_error",
            "code": 502,
        }
    }
    counters = router.proxy.counters
    assert (counters.requests, counters.client_errors) == (4, 2)


def test_routes_ignore_a_trailing_slash_and_method_case(router: Router) -> None:
    request = event("POST", CHAT + "/", SIGNED_CHAT, sample="s1_0")
    request["requestContext"]["http"]["method"] = "post"
    assert answer(router.proxy.handle(request))[0] == 202
    status, body = answer(router.proxy.handle(event("GET", f"{CHAT}/s1_0_1/")))
    assert (status, body["step_id"]) == (200, "s1_0_1")
    # No method in the request context reads as GET.
    bare = event("GET", f"{CHAT}/s1_0_1")
    del bare["requestContext"]["http"]
    assert answer(router.proxy.handle(bare))[1]["status"] == "pending"


def test_a_base64_body_is_decoded(router: Router) -> None:
    request = event("POST", CHAT)
    request["body"] = base64.b64encode(
        json.dumps({**SIGNED_CHAT, "sample_id": "s1_0"}).encode()
    ).decode()
    request["isBase64Encoded"] = True
    assert answer(router.proxy.handle(request)) == (
        202,
        {"step_id": "s1_0_1", "status": "pending", "result": None},
    )


def test_a_body_of_exactly_the_limit_is_taken_and_one_byte_more_is_not(router: Router) -> None:
    def body(sample: str, content: str) -> str:
        return json.dumps({"messages": [{"role": "user", "content": content}], "sample_id": sample})

    at_limit = body("a", "x" * (MAX_BODY_BYTES - len(body("a", ""))))
    assert len(at_limit) == MAX_BODY_BYTES
    assert answer(router.proxy.handle(event("POST", CHAT, at_limit)))[0] == 202
    over = at_limit.replace('"x', '"xx', 1).replace('"a"', '"b"')
    status, answered = answer(router.proxy.handle(event("POST", CHAT, over)))
    assert (status, answered["error"]["message"]) == (
        413,
        f"body of {MAX_BODY_BYTES + 1} bytes exceeds {MAX_BODY_BYTES}",
    )


def test_the_sample_is_the_bodys_sample_id_else_its_user_up_to_128_characters(
    router: Router,
) -> None:
    """The body's `sample_id` is where Nova's starter-kit client names it (no headers)."""
    longest = "s" * ID_LENGTH
    by_user = event("POST", CHAT, {"messages": MESSAGES, "user": longest})
    assert answer(router.proxy.handle(by_user))[1]["step_id"] == step_id_for(longest, 1)
    by_body = event("POST", CHAT, {"messages": MESSAGES, "sample_id": "body_0", "user": "no"})
    assert answer(router.proxy.handle(by_body))[1]["step_id"] == "body_0_1"
    samples = [
        parse(GenerateRequest, message["Body"]).sample_id
        for message in router.messages(router.queues.generate_requests)
    ]
    assert sorted(samples) == sorted([longest, "body_0"])


def test_the_first_turn_opens_the_rollout_and_later_turns_do_not(router: Router) -> None:
    chat(router)
    summary = router.store.run_summary(RUN, now=router.clock() + 61, stuck_after_seconds=60)
    assert (summary["in_flight"], summary["stuck"]) == (1, 1)
    report = {"id": "s1_0", "aggregate_reward_score": 1.0}
    router.proxy.handle(event("POST", REPORT, report))
    second_turn = [*MESSAGES, {"role": "assistant", "content": "[crane]"}]
    assert chat(router, second_turn)[1]["step_id"] == "s1_0_2"
    summary = router.store.run_summary(RUN, now=router.clock(), stuck_after_seconds=60)
    assert (summary["in_flight"], summary["finished"]) == (0, 1)


def test_an_enqueued_step_is_pending_from_that_moment_and_written_once(router: Router) -> None:
    router.clock.now += 7
    writes = []
    router.db.update_item = lambda **request: writes.append(request)
    chat(router)
    step = router.store.get_step(RUN, "s1_0_1")
    assert (step.status, step.sample_id, step.updated_at) == ("pending", "s1_0", router.clock())
    assert router.proxy.counters.enqueued == 1 and writes == []


def test_a_retry_after_the_first_try_died_before_enqueueing_enqueues_it(router: Router) -> None:
    router.store.start_step(RUN, "s1_0_1", sample_id="s1_0", now=router.clock())
    assert chat(router)[1]["status"] == "pending"
    assert len(router.messages(router.queues.generate_requests)) == 1
    counters = router.proxy.counters
    assert (counters.retried_steps, counters.enqueued) == (1, 1)


def test_a_retry_of_a_finished_step_answers_it_without_enqueueing(router: Router) -> None:
    chat(router)
    router.messages(router.queues.generate_requests)
    router.store.complete_step(RUN, "s1_0_1", {"choices": []}, now=router.clock())
    router.clock.now += 2.7
    assert chat(router) == (
        200,
        {"id": "s1_0_1", "object": "chat.completion", "created": int(router.clock()),
         "model": MODEL, "choices": []},
    )  # fmt: skip
    assert not router.messages(router.queues.generate_requests)


def test_the_wait_polls_with_doubling_pauses_up_to_half_a_second(router: Router) -> None:
    pauses: list[float] = []

    def sleep(seconds: float) -> None:
        pauses.append(seconds)
        router.clock.now += seconds

    router.proxy.wait_seconds, router.proxy.sleep = 3.0, sleep
    status, body = chat(router)
    assert (status, body["status"]) == (202, "pending")
    assert pauses[:6] == pytest.approx([0.02, 0.04, 0.08, 0.16, 0.32, 0.5])
    assert max(pauses) == 0.5 and sum(pauses) == pytest.approx(3.0)
    assert pauses[-1] == pytest.approx(3.0 - 0.62 - 4 * 0.5, abs=1e-6)


def test_when_told_of_changes_the_wait_listens_instead_of_polling(router: Router) -> None:
    heard: list[tuple[str, float]] = []

    def step_changes(step_id: str, seconds: float) -> None:
        heard.append((step_id, seconds))
        router.clock.now += 1.5
        if len(heard) == 2:
            router.store.complete_step(RUN, step_id, {"choices": []}, now=router.clock())

    router.proxy = Proxy(
        router.store,
        router.sqs,
        wait_seconds=5.0,
        clock=router.clock,
        sleep=lambda seconds: pytest.fail("polled although told of changes"),
        step_changes=step_changes,
    )
    assert chat(router)[0] == 200
    assert heard == [("s1_0_1", 5.0), ("s1_0_1", 3.5)]


def test_a_steps_status_dates_its_result_by_the_steps_last_change(router: Router) -> None:
    chat(router)
    router.clock.now += 12.9
    router.store.complete_step(RUN, "s1_0_1", {"choices": []}, now=router.clock())
    finished_at = int(router.clock())
    router.clock.now += 100
    assert answer(router.proxy.handle(event("GET", f"{CHAT}/s1_0_1"))) == (
        200,
        {
            "step_id": "s1_0_1",
            "status": "completed",
            "result": {"id": "s1_0_1", "object": "chat.completion", "created": finished_at,
                       "model": MODEL, "choices": []},
        },
    )  # fmt: skip
    assert answer(router.proxy.handle(event("GET", f"{CHAT}/s9_9_X/"))) == (
        404,
        {"error": {"message": "no step 's9_9_X' in run 'run-1'", "type": NOT_FOUND, "code": 404}},
    )


def test_a_report_is_deduplicated_by_its_request_id_or_else_its_id(router: Router) -> None:
    report = {"id": "s1_0 with space", "aggregate_reward_score": 0.25}
    router.proxy.handle(event("POST", REPORT, report))
    (message,) = router.messages(router.queues.rollout_responses)
    ids = message["Attributes"]["MessageGroupId"], message["Attributes"]["MessageDeduplicationId"]
    assert ids == (fifo_id("s1_0 with space"), fifo_id("s1_0 with space"))
    item = router.db.get_item(
        TableName=TABLE, Key={"run_id": {"S": RUN}, "item": {"S": "rollout#s1_0 with space"}}
    )["Item"]
    assert (item["status"]["S"], item["score"]["N"]) == ("completed", "0.25")


def test_a_failed_report_is_recorded_as_failed_and_counted_once(router: Router) -> None:
    failed = {"id": "s", "aggregate_reward_score": None, "stop_reason": "timeout"}
    for _ in range(3):
        router.proxy.handle(event("POST", REPORT, failed))
    summary = router.store.run_summary(RUN, now=router.clock(), stuck_after_seconds=60)
    assert (summary["failed"], summary["finished"]) == (1, 0)
    counters = router.proxy.counters
    assert (counters.reports, counters.duplicate_reports) == (3, 2)
    status, body = answer(
        router.proxy.handle(
            event(
                "POST", REPORT, {"id": "s", "aggregate_reward_score": 1.0, "stop_reason": "timeout"}
            )
        )
    )
    assert (status, body["error"]["message"]) == (
        400,
        "a rollout stopped by 'timeout' has no aggregate_score: send null",
    )


def test_the_deployed_proxy_reads_its_table_and_wait_from_the_environment(router: Router) -> None:
    proxy = proxy_for({"TABLE_NAME": TABLE, "WAIT_SECONDS": "0"}, Clients(boto3.Session()))
    assert proxy.wait_seconds == 0.0
    assert answer(proxy.handle(event("POST", CHAT, SIGNED_CHAT, sample="s1_0")))[0] == 202
    (message,) = router.messages(router.queues.generate_requests)
    assert parse(GenerateRequest, message["Body"]).step_id == "s1_0_1"
    default = proxy_for({"TABLE_NAME": TABLE}, Clients(boto3.Session()))
    assert default.wait_seconds == 5.0


def test_a_step_that_vanished_while_waiting_is_still_pending_to_the_caller(router: Router) -> None:
    """A step's record can expire (the table's TTL) or be deleted under a slow caller: it gets
    "pending" to poll again, not an error."""
    router.store.get_step = lambda run_id, step_id: None
    router.proxy.wait_seconds = 0.5
    assert chat(router) == (202, {"step_id": "s1_0_1", "status": "pending", "result": None})


def reads(router: Router, name: str) -> list[str]:
    """The store's `name` reads from now on (get_run, get_step), by their first argument."""
    read, seen = getattr(router.store, name), []

    def counted(key: str, *rest: str):  # type: ignore[no-untyped-def]
        seen.append(key)
        return read(key, *rest)

    setattr(router.store, name, counted)
    return seen


def test_a_just_enqueued_step_is_first_read_after_the_first_pause(router: Router) -> None:
    steps = reads(router, "get_step")
    router.proxy.wait_seconds = 3

    def sleep_then_complete(seconds: float) -> None:
        assert not steps, "read before the first pause"
        router.clock.sleep(seconds)
        router.store.complete_step(RUN, "s1_0_1", {"choices": []}, now=router.clock())

    router.proxy.sleep = sleep_then_complete
    assert chat(router)[0] == 200
    assert steps == [RUN]
    # Without any wait, nothing is read at all: the step was enqueued just now.
    router.proxy.wait_seconds = 0
    assert chat(router, sample="s2_0") == (
        202,
        {"step_id": "s2_0_1", "status": "pending", "result": None},
    )
    assert steps == [RUN]


def test_a_retry_is_answered_from_the_read_that_found_it_retried(router: Router) -> None:
    chat(router)
    router.store.complete_step(RUN, "s1_0_1", {"choices": []}, now=router.clock())
    steps = reads(router, "get_step")
    router.proxy.sleep = lambda seconds: pytest.fail("waited for a step already answered")
    assert chat(router)[0] == 200
    assert steps == [RUN]
    router.store.set_step_status(RUN, "s2_0_1", "failed", expected="pending", now=0)
    chat(router, sample="s2_0")
    router.store.set_step_status(RUN, "s2_0_1", "failed", expected="pending", now=0)
    assert chat(router, sample="s2_0")[0] == 502


def test_a_runs_registration_is_read_again_only_after_the_cache_time(router: Router) -> None:
    runs = reads(router, "get_run")
    for sample in ("s1_0", "s2_0"):
        assert chat(router, sample=sample)[0] == 202
    assert runs == [RUN]
    router.clock.now += RUN_CACHE_SECONDS - 0.01
    chat(router, sample="s3_0")
    assert runs == [RUN]
    router.clock.now += 0.01
    chat(router, sample="s4_0")
    assert runs == [RUN, RUN]


def test_a_cached_registration_still_refuses_a_wrong_token_and_a_removed_run_expires(
    router: Router,
) -> None:
    assert chat(router)[0] == 202
    assert chat(router, sample="s2_0", token=OTHER_TOKEN)[0] == 403
    assert router.store.remove_run(RUN)  # what teardown does
    assert chat(router, sample="s3_0")[0] == 202  # a warm proxy's bound: RUN_CACHE_SECONDS
    router.clock.now += RUN_CACHE_SECONDS
    assert chat(router, sample="s4_0")[0] == 403
    router.clock.now += RUN_CACHE_SECONDS
    assert chat(router, sample="s5_0")[0] == 403  # an unknown run is not remembered


def test_a_registration_past_its_runs_deadline_is_refused_before_dynamodb_deletes_it(
    router: Router,
) -> None:
    """The token lasts until the run's deadline and an hour (REGISTRATION_GRACE_SECONDS); the
    table's TTL deletes the item only some time after, so the proxy checks it, cached or not."""
    deadline = router.clock() + 600
    router.store.put_run(
        RUN, token=TOKEN, queues=router.queues.urls(), model=MODEL, now=router.clock(),
        deadline_at=deadline,
    )  # fmt: skip
    item = router.db.get_item(TableName=TABLE, Key={"run_id": {"S": RUN}, "item": {"S": "run"}})
    assert int(item["Item"]["expires_at"]["N"]) == int(deadline + REGISTRATION_GRACE_SECONDS)
    assert chat(router)[0] == 202
    router.clock.now = deadline + REGISTRATION_GRACE_SECONDS - 1
    assert chat(router, sample="s2_0")[0] == 202
    router.clock.now += 1  # still in the warm proxy's cache, still in the table: refused
    status, body = chat(router, sample="s3_0")
    assert status == 403 and body["error"]["type"] == "auth_error"
    assert router.store.get_run(RUN) is not None


def test_an_unknown_run_is_read_every_time_so_a_new_run_is_served_at_once(router: Router) -> None:
    runs = reads(router, "get_run")
    assert chat(router, run="run-3", token="secret-token-3")[0] == 403
    router.store.put_run(
        "run-3",
        token="secret-token-3",
        queues=router.queues.urls(),
        model=MODEL,
        now=router.clock(),
    )
    assert chat(router, run="run-3", token="secret-token-3")[0] == 202
    assert runs == ["run-3", "run-3"]


def test_the_proxy_remembers_a_bounded_number_of_runs_dropping_the_oldest(router: Router) -> None:
    runs = reads(router, "get_run")
    for number in range(RUN_CACHE_SIZE + 1):  # unknown runs: refused and not remembered
        chat(router, run=f"gone-{number}", token="t")
    for number in range(3, RUN_CACHE_SIZE + 3):
        router.store.put_run(
            f"r{number}", token="t", queues=router.queues.urls(), model=MODEL, now=router.clock()
        )
        chat(router, run=f"r{number}", token="t", sample="s")
    del runs[:]
    chat(router, run="r3", token="t", sample="s")  # still remembered: RUN_CACHE_SIZE runs
    assert runs == []
    chat(router, sample="s")  # one more run: the one read longest ago (r3) goes
    chat(router, run="r4", token="t", sample="s")
    chat(router, run="r3", token="t", sample="s")
    assert runs == [RUN, "r3"]


def test_a_registration_read_again_counts_as_the_newest_read(router: Router) -> None:
    runs = reads(router, "get_run")
    for number in range(RUN_CACHE_SIZE):
        router.store.put_run(
            f"r{number}", token="t", queues=router.queues.urls(), model=MODEL, now=router.clock()
        )
        chat(router, run=f"r{number}", token="t", sample="s")
    router.clock.now += RUN_CACHE_SECONDS
    chat(router, run="r1", token="t", sample="s")  # expired: read again, now the newest
    router.store.put_run(
        "r64", token="t", queues=router.queues.urls(), model=MODEL, now=router.clock()
    )
    for run, token in ((RUN, TOKEN), ("r64", "t")):  # two more runs: r0 and r2 make room
        chat(router, run=run, token=token, sample="s")
    del runs[:]
    chat(router, run="r1", token="t", sample="s")
    assert runs == []
