"""What an agent has learned of a support-desk case from the conversation so far, and the
scripted oracle that works a case by the book (the environment's ceiling).

Both read only what the agent sees: the task text and the tool answers, matched to the calls
by `tool_call_id`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from reward_envs.interface import Message, tool_turn
from reward_envs.support_desk.case import policy_allows

_TASK = re.compile(r"\((?P<customer>C-\d+)\) asks for a refund of order (?P<order>O-\d+)")


@dataclass
class Notes:
    customer_id: str | None = None
    order_id: str | None = None
    order: dict[str, Any] | None = None
    customer: dict[str, Any] | None = None
    policy: dict[str, Any] | None = None
    refund_issued: bool = False
    last_refund_transient: bool = False
    finished: bool = False

    @property
    def complete(self) -> bool:
        """Everything the decision needs is known."""
        return None not in (self.order, self.customer, self.policy)

    def refund_allowed(self) -> bool | None:
        """The policy's answer from what is known; None until it is all known."""
        if not self.complete:
            return None
        order, policy = self.order or {}, self.policy or {}
        return policy_allows(
            asking_customer=self.customer_id,
            order_customer=order.get("customer_id"),
            status=order.get("status"),
            delivered_days_ago=order.get("delivered_days_ago"),
            refunded=order.get("refunded"),
            window_days=policy.get("window_days"),
        )


def read_notes(messages: Sequence[Message]) -> Notes:
    notes = Notes()
    calls: dict[str, tuple[str, dict[str, Any]]] = {}
    for message in messages:
        role = message.get("role")
        if role == "user" and notes.order_id is None:
            found = _TASK.search(str(message.get("content") or ""))
            if found:
                notes.customer_id, notes.order_id = found["customer"], found["order"]
        elif role == "assistant":
            for call in message.get("tool_calls") or []:
                if not isinstance(call, dict):
                    continue
                function = call.get("function") or {}
                try:
                    arguments = json.loads(function.get("arguments") or "{}")
                except (json.JSONDecodeError, TypeError):
                    arguments = {}
                calls[str(call.get("id"))] = (str(function.get("name")), arguments)
        elif role == "tool":
            name, _ = calls.get(str(message.get("tool_call_id")), ("", {}))
            try:
                answer = json.loads(str(message.get("content")))
            except json.JSONDecodeError:
                continue
            _note(notes, name, answer if isinstance(answer, dict) else {})
    return notes


def _note(notes: Notes, name: str, answer: dict[str, Any]) -> None:
    if "error" in answer:
        notes.last_refund_transient = name == "issue_refund" and bool(answer.get("transient"))
        return
    if name == "get_order" and answer.get("order_id") == notes.order_id:
        notes.order = answer
    elif name == "get_customer" and answer.get("customer_id") == notes.customer_id:
        notes.customer = answer
    elif (
        name == "get_refund_policy"
        and notes.customer
        and answer.get("tier") == notes.customer.get("tier")
    ):
        notes.policy = answer
    elif name == "issue_refund":
        notes.refund_issued, notes.last_refund_transient = True, False
    elif name == "finish":
        notes.finished = True


def call(call_id: str, name: str, **arguments: Any) -> Message:
    """An assistant turn that calls one tool."""
    return tool_turn(name, json.dumps(arguments, sort_keys=True), call_id=call_id)


def oracle_reply(messages: Sequence[Message]) -> Message:
    """The next call of an agent that works the case by the book: the order, the customer, the
    tier's policy, then the refund (again after a transient failure) or not, then finish."""
    notes, turn = read_notes(messages), f"call_{len(messages)}"
    if notes.order is None:
        return call(turn, "get_order", order_id=notes.order_id or "")
    if notes.customer is None:
        return call(turn, "get_customer", customer_id=notes.customer_id or "")
    if notes.policy is None:
        return call(turn, "get_refund_policy", tier=notes.customer.get("tier"))
    if notes.refund_allowed() and not notes.refund_issued:
        amount = notes.order["amount_cents"]
        return call(turn, "issue_refund", order_id=notes.order_id, amount_cents=amount)
    if notes.refund_issued:
        return call(turn, "finish", decision="refunded", message="Your refund has been issued.")
    return call(turn, "finish", decision="denied", message="Our policy does not allow this refund.")
