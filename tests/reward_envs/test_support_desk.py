"""The support desk: conformance, its reward table played turn by turn through the worker's
rollout, the oracle's ceiling, and its records as datasets take them."""

from __future__ import annotations

import io
import json
import random
from collections.abc import Sequence
from dataclasses import replace

import pytest

from domain.dataset import DatasetValidator
from domain.protocol import RolloutRequest
from reward_envs.conformance import check_environment
from reward_envs.interface import Message, Record, Reply, tool_turn
from reward_envs.registry import load
from reward_envs.support_desk import SupportDeskEnvironment, oracle_reply, record_for
from reward_envs.support_desk.case import VARIANTS, Case, Order, draw_case
from reward_envs.support_desk.notes import call
from reward_envs.worker.model_client import CallableModel
from reward_envs.worker.rollout import play_rollout

ENV = SupportDeskEnvironment()
GRANT = Case(
    customer_id="C-1001",
    customer_name="Ana Ruiz",
    tier="standard",
    order_id="O-20001",
    orders=(
        Order("O-20001", "C-1001", "kettle", 4599, "delivered", 12),
        Order("O-20002", "C-2002", "lamp", 1999, "delivered", 3),
    ),
)
TOO_LATE = replace(GRANT, orders=(replace(GRANT.orders[0], delivered_days_ago=45),))


def record(case: Case) -> Record:
    return Record(id="case-1", metadata={"prompt": case.task(), "info": case.as_info()})


def play(case: Case, turns: Sequence[Message | str]) -> tuple[float | None, dict[str, float]]:
    """Plays `turns` (then the oracle) through the worker's rollout: the episode reward and
    the environment's metrics."""
    script = iter(turns)

    def reply(messages: Sequence[Message]) -> Message | str:
        return next(script, None) or oracle_reply(messages)

    request = RolloutRequest(sample_id="case-1_0", data=record(case).metadata)
    response = play_rollout(ENV, CallableModel(reply), request).response
    metrics = {m.name.removeprefix("env/"): m.value for m in response.metrics}
    return response.aggregate_score, metrics


def checks(case: Case) -> list[Message]:
    return [
        call("c1", "get_order", order_id=case.order_id),
        call("c2", "get_customer", customer_id=case.customer_id),
        call("c3", "get_refund_policy", tier=case.tier),
    ]


def garbled(name: str, arguments: str) -> Message:
    return tool_turn(name, arguments, call_id="bad")


def many_garbled(count: int) -> Message:
    turn = garbled("nope", "{}")
    return {**turn, "tool_calls": turn["tool_calls"] * count}


def test_the_support_desk_passes_the_conformance_kit() -> None:
    report = check_environment(load("support_desk"), episodes=12)
    assert report.passed, report.summary()


@pytest.mark.parametrize(
    ("case", "turns", "reward"),
    [
        (GRANT, [], 1.0),  # by the book
        (TOO_LATE, [], 1.0),  # by the book: denied
        (TOO_LATE, [call("x", "finish", decision="denied", message="no")], 0.0),  # a guess
        (GRANT, [*checks(GRANT), call("x", "finish", decision="denied", message="no")], 0.2),
        (
            TOO_LATE,
            [*checks(TOO_LATE), call("r", "issue_refund", order_id="O-20001", amount_cents=4599)],
            0.2,  # refunded against the policy: database and decision wrong
        ),
        (
            GRANT,
            [*checks(GRANT), call("r", "issue_refund", order_id="O-20001", amount_cents=100)],
            0.4,  # a partial refund: the database is wrong
        ),
        (GRANT, [garbled("refund_everything", "{}")], 0.95),  # unknown tool
        (GRANT, [garbled("get_order", '{"order_id": "O-2')], 0.95),  # arguments not JSON
        (GRANT, [garbled("get_order", '["O-20001"]')], 0.95),  # not an object
        (GRANT, [call("x", "get_order", order="O-20001")], 0.95),  # wrong argument name
        (GRANT, [call("x", "get_order", order_id="O-99999")], 0.95),  # no such order
        (GRANT, ["I will look into it."], 0.95),  # a turn without a tool call
        (GRANT, [*checks(GRANT), checks(GRANT)[0]], 0.95),  # a read repeated
        (GRANT, [garbled("nope", "{}")] * 3 + ["hm"], 0.8),  # four wasted calls
        (GRANT, [many_garbled(3), many_garbled(3)], 0.8),  # six: the waste share floors at 0
    ],
)
def test_the_reward_table(case: Case, turns: list[Message | str], reward: float) -> None:
    score, metrics = play(case, turns)
    assert score == pytest.approx(reward)
    assert metrics["success"] == (reward >= 0.8)


def test_a_transient_refund_failure_is_retried_without_penalty_and_counted_as_recovered() -> None:
    flaky = replace(GRANT, transient_failures=2)
    score, metrics = play(flaky, [])
    assert score == 1.0
    assert metrics["transient_errors"] == 2 and metrics["recovered"] == 1.0
    assert metrics["tool_calls"] == 7  # three reads, three refund attempts, finish


def test_unfinished_cases_earn_the_database_share_only() -> None:
    stall = [call("x", "get_order", order_id="O-99999")] * 10
    assert play(GRANT, stall)[0] == 0.0
    refund = call("r", "issue_refund", order_id="O-20001", amount_cents=4599)
    assert play(GRANT, [*checks(GRANT), refund, *stall])[0] == pytest.approx(0.3)


def test_the_oracle_solves_every_case_and_random_tool_calls_earn_nothing() -> None:
    rewards, random_rewards = [], []
    for index in range(64):
        case = Case.from_info(record_for(index).metadata["info"])
        rewards.append(play(case, [])[0])
        rng = random.Random(index)
        request = RolloutRequest(sample_id=f"r{index}_0", data=record(case).metadata)
        model = CallableModel(lambda messages, rng=rng: ENV.example_reply(messages, rng))
        random_rewards.append(play_rollout(ENV, model, request).response.aggregate_score)
    assert rewards == [1.0] * 64
    assert sum(random_rewards) / 64 < 0.1


def test_malformed_calls_reach_the_environment_as_such() -> None:
    reply = Reply.of(garbled("get_order", "{oops"), ENV.tools)
    (use,) = reply.tool_calls
    assert use.name == "get_order" and use.arguments is None
    assert use.problem is not None and use.problem.startswith("arguments are not JSON")
    assert (
        Reply.of(garbled("drop_tables", "{}"), ENV.tools)
        .tool_calls[0]
        .problem.startswith("unknown tool 'drop_tables'")
    )
    episode, _ = ENV.reset(record(GRANT))
    answer = episode.act(reply)
    assert answer.messages == [
        {"role": "tool", "tool_call_id": "bad", "content": json.dumps({"error": use.problem})}
    ]


def test_records_are_valid_datasets_drawn_from_their_seed_half_of_them_to_grant() -> None:
    records = ENV.example_records(200, seed=3)
    assert records == ENV.example_records(200, seed=3) != ENV.example_records(200, seed=4)
    lines = b"".join(
        json.dumps({"id": r.id, "metadata": r.metadata, "tools": list(ENV.tools)}).encode() + b"\n"
        for r in records
    )
    validator = DatasetValidator()
    assert list(validator.problems(io.BytesIO(lines))) == []
    assert validator.summary.valid and validator.summary.records == 200
    grants = sum(Case.from_info(r.metadata["info"]).refund_allowed() for r in records)
    assert 70 <= grants <= 130
    assert VARIANTS.count("grant") * 2 == len(VARIANTS)


def test_a_record_without_a_case_draws_one_from_its_id_and_seed() -> None:
    bare = Record(id="ask-7", metadata={"prompt": "help"})
    first = ENV.reset(bare, seed=1)[1]
    assert first == ENV.reset(bare, seed=1)[1] != ENV.reset(bare, seed=2)[1]
    assert draw_case(random.Random(5)) == draw_case(random.Random(5))
    with pytest.raises(ValueError, match="not a support-desk case"):
        ENV.reset(Record(id="x", metadata={"info": {"customer_id": "C-1"}}))


def test_every_wasted_call_is_counted_and_shown_to_the_model() -> None:
    turns = [
        garbled("nope", "{}"),
        garbled("get_order", "{oops"),
        "hm",
        call("x", "get_order", order_id="O-9"),
    ]
    score, metrics = play(GRANT, turns)
    assert score == pytest.approx(0.8)
    assert metrics["wasted_calls"] == 4
    assert (metrics["informed"], metrics["state_correct"], metrics["decision_correct"]) == (1, 1, 1)
    episode, _ = ENV.reset(record(GRANT))
    refused = episode.act(Reply.of(call("x", "get_order", order_id="O-9"), ENV.tools))
    assert refused.messages == [
        {"role": "tool", "tool_call_id": "x", "content": json.dumps({"error": "no order 'O-9'"})}
    ]
    assert not refused.done and refused.reward == 0.0 and refused.info["wasted_calls"] == 1


def test_a_malformed_finish_is_wasted_and_leaves_the_case_open() -> None:
    bad = call("f", "finish", decision="maybe", message="?")
    episode, _ = ENV.reset(record(GRANT))
    answer = episode.act(Reply.of(bad, ENV.tools))
    assert not answer.done and answer.info["wasted_calls"] == 1
    assert "finish takes decision" in answer.messages[0]["content"]
    assert play(GRANT, [bad])[0] == pytest.approx(0.95)


def test_calls_after_finish_are_wasted_and_a_closed_case_takes_no_more() -> None:
    episode, _ = ENV.reset(record(TOO_LATE))
    for turn in checks(TOO_LATE):
        episode.act(Reply.of(turn, ENV.tools))
    finish = call("f", "finish", decision="denied", message="Sorry.")
    late = checks(TOO_LATE)[0]["tool_calls"][0]
    both = {**finish, "tool_calls": [*finish["tool_calls"], {**late, "id": "late"}]}
    closing = episode.act(Reply.of(both, ENV.tools))
    assert closing.done and closing.reward == pytest.approx(0.95)
    assert [json.loads(m["content"]) for m in closing.messages] == [
        {"status": "case closed"},
        {"error": "the case is already finished"},
    ]
    again = episode.act(Reply.of(finish, ENV.tools))
    assert (again.done, again.reward, again.messages) == (True, 0.0, [])


def test_recovered_needs_the_refund_to_go_through_after_a_transient_failure() -> None:
    flaky = replace(GRANT, transient_failures=1)
    refund = call("r", "issue_refund", order_id="O-20001", amount_cents=4599)
    finish = call("f", "finish", decision="refunded", message="Done.")
    gave_up = play(flaky, [*checks(flaky), refund, finish])[1]
    assert gave_up["transient_errors"] == 1 and gave_up["recovered"] == 0.0
    assert play(GRANT, [])[1]["recovered"] == 0.0  # no failure, nothing to recover from
