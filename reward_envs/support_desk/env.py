"""The support desk: an agent environment that needs tools to win.

A customer asks for a refund of an order. The agent has five tools (`shop.TOOLS`): look up the
order, the customer and the tier's refund policy, issue a refund (a service that sometimes
fails transiently), and `finish(decision, message)`. It wins by leaving the database right and
telling the customer the right decision, without wasted calls.

Reward, in [0, 1], given on the turn that ends the episode (earlier turns give 0):

| part | reward |
|---|---|
| the database is right: one full refund of the order when the policy allows it, none otherwise | 0.6 |
| `finish` says the right decision (`refunded` when the policy allows it, else `denied`) | 0.2 |
| no wasted calls | 0.2, less 0.05 per wasted call (floor 0) |
| not finished within 10 turns | 0.3 if the database is right, else 0 |
| finished without having looked up the order, the customer and the tier's policy (a guess) | 0 |

A wasted call: an unknown tool, arguments that are not a JSON object, a call the tool refuses
(wrong arguments, unknown ids), a read repeated with the same arguments after it answered, a
turn with no tool call, a call after `finish` in the same turn. A transient failure of the
refund service is not the agent's fault: retrying it is not wasted, and `env/recovered` counts
the episodes whose refund went through after one. Success (`env/success`): an informed finish
with the database right and the decision right.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from reward_envs.interface import (
    Environment,
    Episode,
    Message,
    Record,
    Reply,
    RewardRange,
    StepResult,
    ToolUse,
    tool_result,
    tool_turn,
)
from reward_envs.support_desk.case import Case, draw_case
from reward_envs.support_desk.shop import TOOLS, BadRequest, Refund, Shop

MAX_TURNS = 10
STATE_REWARD = 0.6
DECISION_REWARD = 0.2
EFFICIENCY_REWARD = 0.2
WASTE_PENALTY = 0.05
UNFINISHED_STATE_REWARD = 0.3
READS = frozenset({"get_order", "get_customer", "get_refund_policy"})
USE_THE_TOOLS = (
    "Please work the case with the tools (get_order, get_customer, get_refund_policy, "
    "issue_refund) and end with finish(decision, message)."
)


@dataclass
class SupportDeskEpisode(Episode):
    shop: Shop
    turns: int = 0
    calls: int = 0
    wasted: int = 0
    decision: str | None = None
    answered_reads: set[str] = field(default_factory=set)
    checked: set[str] = field(default_factory=set)  # the reads the decision needs, done
    refunded_after_transient: bool = False

    def act(self, reply: Reply) -> StepResult:
        if self.decision is not None:
            return StepResult(messages=[], reward=0.0, done=True, info={"error": "case is closed"})
        self.turns += 1
        if not reply.tool_calls:
            self.wasted += 1
            return self._after_turn([{"role": "user", "content": USE_THE_TOOLS}])
        answers = [self._answer(call) for call in reply.tool_calls]
        return self._after_turn(answers)

    def _answer(self, call: ToolUse) -> Message:
        self.calls += 1
        if self.decision is not None:
            self.wasted += 1
            return tool_result(call, {"error": "the case is already finished"})
        if call.problem is not None or call.arguments is None:
            self.wasted += 1
            return tool_result(call, {"error": call.problem})
        if call.name == "finish":
            return self._finish(call)
        key = _read_key(call.name, call.arguments)
        try:
            answer = self.shop.call(call.name, call.arguments)
        except BadRequest as refused:
            self.wasted += 1
            return tool_result(call, {"error": str(refused)})
        if call.name in READS:
            if key in self.answered_reads:
                self.wasted += 1
            self.answered_reads.add(key)
            if key in self._needed_reads():
                self.checked.add(key)
        elif "refund_id" in answer and self.shop.transient_errors:
            self.refunded_after_transient = True
        return tool_result(call, answer)

    def _finish(self, call: ToolUse) -> Message:
        arguments = call.arguments or {}
        decision, message = arguments.get("decision"), arguments.get("message")
        if decision not in ("refunded", "denied") or not isinstance(message, str):
            self.wasted += 1
            return tool_result(
                call, {"error": "finish takes decision ('refunded' or 'denied') and message (text)"}
            )
        self.decision = decision
        return tool_result(call, {"status": "case closed"})

    def _needed_reads(self) -> set[str]:
        case = self.shop.case
        return {
            _read_key("get_order", {"order_id": case.order_id}),
            _read_key("get_customer", {"customer_id": case.customer_id}),
            _read_key("get_refund_policy", {"tier": case.tier}),
        }

    def state_correct(self) -> bool:
        case = self.shop.case
        issued = self.shop.refunds_issued()
        if case.refund_allowed() and case.order is not None:
            return issued == [Refund(case.order_id, case.order.amount_cents)]
        return issued == []

    def _after_turn(self, messages: list[Message]) -> StepResult:
        finished = self.decision is not None
        info: dict[str, Any] = {
            "turn": self.turns,
            "tool_calls": self.calls,
            "wasted_calls": self.wasted,
            "transient_errors": self.shop.transient_errors,
        }
        if not finished and self.turns < MAX_TURNS:
            return StepResult(messages=messages, reward=0.0, done=False, info=info)
        right_state = self.state_correct()
        right_decision = self.decision == (
            "refunded" if self.shop.case.refund_allowed() else "denied"
        )
        informed = self.checked == self._needed_reads()
        if finished and not informed:
            reward = 0.0
        elif finished:
            reward = (
                STATE_REWARD * right_state
                + DECISION_REWARD * right_decision
                + max(0.0, EFFICIENCY_REWARD - WASTE_PENALTY * self.wasted)
            )
        else:
            reward = UNFINISHED_STATE_REWARD * right_state
        info |= {
            "finished": finished,
            "informed": informed,
            "state_correct": right_state,
            "decision_correct": right_decision,
            "recovered": self.refunded_after_transient,
            "success": finished and informed and right_state and right_decision,
            "episode_reward": reward,
        }
        self.shop.close()
        return StepResult(messages=messages, reward=reward, done=True, info=info)


class SupportDeskEnvironment(Environment):
    """The case from the record's `metadata.info` (a `Case`, as `example_records` and
    `mtrl env data support_desk` write it), or drawn from the record id and seed."""

    name = "support_desk"
    version = "1"
    reward_range = RewardRange(0.0, 1.0)
    max_turns = MAX_TURNS
    tools = TOOLS

    def reset(self, record: Record, *, seed: int = 0) -> tuple[SupportDeskEpisode, list[Message]]:
        info = record.metadata.get("info")
        case = (
            Case.from_info(info)
            if info is not None
            else draw_case(random.Random(f"{record.id}\0{seed}"))
        )
        first: list[Message] = [{"role": "user", "content": case.task()}]
        return SupportDeskEpisode(shop=Shop(case)), first

    def example_records(self, count: int, *, seed: int = 0) -> list[Record]:
        return [record_for(index, seed) for index in range(count)]

    def example_reply(self, messages: Sequence[Message], rng: random.Random) -> Message:
        """A random call of a random tool with arguments from the conversation's ids."""
        text = " ".join(str(message.get("content") or "") for message in messages)
        ids = [word.strip(".,()'\"") for word in text.split() if word[:2] in ("O-", "C-")] or [
            "O-1"
        ]
        tool = rng.choice(TOOLS)["function"]
        arguments = {
            name: rng.choice(ids) if spec.get("type") == "string" and "enum" not in spec
            else rng.choice(spec.get("enum", [0, 1, 999]))
            for name, spec in tool["parameters"]["properties"].items()
        }  # fmt: skip
        return tool_turn(
            tool["name"], json.dumps(arguments), call_id=f"call_{rng.randrange(10**6)}"
        )


def _read_key(name: str, arguments: Mapping[str, Any]) -> str:
    """What tells one look-up from another: the tool and its arguments."""
    return f"{name}:{json.dumps(arguments, sort_keys=True)}"


def record_for(index: int, seed: int = 0) -> Record:
    """The `index`th record of dataset `seed`: a drawn case, with its task as the prompt."""
    case = draw_case(random.Random(f"support-desk\0{seed}\0{index}"))
    return Record(
        id=f"desk-{seed}-{index}",
        metadata={"prompt": case.task(), "task": "support_desk", "info": case.as_info()},
    )


def load_environment(**kwargs: object) -> SupportDeskEnvironment:
    """The verifiers-style entry point."""
    if kwargs:
        raise TypeError(f"support_desk takes no options, got {sorted(kwargs)}")
    return SupportDeskEnvironment()
