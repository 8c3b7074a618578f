"""The shop behind the support desk: an SQLite database per episode, and the tools that read and
change it, as an agent would call them.

The tools behave like real back-office APIs: they do what they are asked if the request is
well-formed — `issue_refund` does not check the refund policy (that is the agent's job) — and
answer a bad request with an error object instead of raising. The refund service fails with a
transient error the case's `transient_failures` times before it works.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from reward_envs.support_desk.case import WINDOW_DAYS, Case

SCHEMA = """
CREATE TABLE customers (id TEXT PRIMARY KEY, name TEXT NOT NULL, tier TEXT NOT NULL);
CREATE TABLE orders (
    id TEXT PRIMARY KEY, customer_id TEXT NOT NULL, item TEXT NOT NULL,
    amount_cents INTEGER NOT NULL, status TEXT NOT NULL, delivered_days_ago INTEGER
);
CREATE TABLE refunds (
    id INTEGER PRIMARY KEY AUTOINCREMENT, order_id TEXT NOT NULL, amount_cents INTEGER NOT NULL,
    issued_in_episode INTEGER NOT NULL
);
"""


def _function(name: str, description: str, properties: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": sorted(properties),
                "additionalProperties": False,
            },
        },
    }


_ID = {"type": "string"}
TOOLS: tuple[dict[str, Any], ...] = (
    _function("get_order", "Look up an order by its id (O-12345).", {"order_id": _ID}),
    _function("get_customer", "Look up a customer by id (C-1234).", {"customer_id": _ID}),
    _function(
        "get_refund_policy",
        "The refund policy of a customer tier (standard or gold).",
        {"tier": {"type": "string", "enum": sorted(WINDOW_DAYS)}},
    ),
    _function(
        "issue_refund",
        "Refund an order (amount in cents). The refund service sometimes fails transiently; "
        "try again then.",
        {"order_id": _ID, "amount_cents": {"type": "integer"}},
    ),
    _function(
        "finish",
        "End the case: decision 'refunded' or 'denied', and the message to the customer.",
        {"decision": {"type": "string", "enum": ["denied", "refunded"]}, "message": _ID},
    ),
)
# The argument names each tool takes (OpenAI's `parameters`), which `Shop.call` checks.
PARAMETERS = {
    tool["function"]["name"]: frozenset(tool["function"]["parameters"]["properties"])
    for tool in TOOLS
}


class BadRequest(ValueError):
    """A call the tool cannot serve (wrong argument names or types, unknown ids)."""


@dataclass(frozen=True)
class Refund:
    order_id: str
    amount_cents: int


class Shop:
    """One episode's database. `check_same_thread=False`: an episode may be stepped from any
    one thread at a time (the worker's pool)."""

    def __init__(self, case: Case) -> None:
        self.case = case
        self._db = sqlite3.connect(":memory:", check_same_thread=False)
        self._db.executescript(SCHEMA)
        self._db.execute(
            "INSERT INTO customers VALUES (?, ?, ?)",
            (case.customer_id, case.customer_name, case.tier),
        )
        for order in case.orders:
            self._db.execute(
                "INSERT INTO orders VALUES (?, ?, ?, ?, ?, ?)",
                (
                    order.id, order.customer_id, order.item, order.amount_cents, order.status,
                    order.delivered_days_ago,
                ),
            )  # fmt: skip
            if order.refunded:  # refunded before this episode
                self._db.execute(
                    "INSERT INTO refunds (order_id, amount_cents, issued_in_episode) "
                    "VALUES (?, ?, 0)",
                    (order.id, order.amount_cents),
                )
        self._failures_left = case.transient_failures
        self.transient_errors = 0
        self._tools: Mapping[str, Callable[..., dict[str, Any]]] = {
            "get_order": self.get_order,
            "get_customer": self.get_customer,
            "get_refund_policy": self.get_refund_policy,
            "issue_refund": self.issue_refund,
        }

    def call(self, name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """Run tool `name` (not `finish`, which the episode handles); BadRequest when the call
        is wrong."""
        tool, expected = self._tools[name], PARAMETERS[name]
        if set(arguments) != expected:
            raise BadRequest(f"{name} takes {', '.join(sorted(expected))}; got {sorted(arguments)}")
        return tool(**arguments)

    def get_order(self, order_id: Any) -> dict[str, Any]:
        row = self._db.execute(
            "SELECT o.id, o.customer_id, o.item, o.amount_cents, o.status, o.delivered_days_ago, "
            "EXISTS (SELECT 1 FROM refunds r WHERE r.order_id = o.id) FROM orders o WHERE o.id = ?",
            (_text(order_id, "order_id"),),
        ).fetchone()
        if row is None:
            raise BadRequest(f"no order {order_id!r}")
        keys = ("order_id", "customer_id", "item", "amount_cents", "status", "delivered_days_ago")
        return {**dict(zip(keys, row[:6], strict=True)), "refunded": bool(row[6])}

    def get_customer(self, customer_id: Any) -> dict[str, Any]:
        row = self._db.execute(
            "SELECT id, name, tier FROM customers WHERE id = ?",
            (_text(customer_id, "customer_id"),),
        ).fetchone()
        if row is None:
            raise BadRequest(f"no customer {customer_id!r}")
        return {"customer_id": row[0], "name": row[1], "tier": row[2]}

    def get_refund_policy(self, tier: Any) -> dict[str, Any]:
        if tier not in WINDOW_DAYS:
            raise BadRequest(f"no tier {tier!r}: one of {', '.join(sorted(WINDOW_DAYS))}")
        return {
            "tier": tier,
            "window_days": WINDOW_DAYS[tier],
            "rules": "Full refund of a delivered order, within window_days of delivery, to the "
            "customer who placed it; one refund per order.",
        }

    def issue_refund(self, order_id: Any, amount_cents: Any) -> dict[str, Any]:
        order = self.get_order(order_id)
        if not isinstance(amount_cents, int) or isinstance(amount_cents, bool):
            raise BadRequest("amount_cents must be an integer number of cents")
        if not 0 < amount_cents <= order["amount_cents"]:
            raise BadRequest(f"amount_cents must be between 1 and {order['amount_cents']}")
        if self._failures_left > 0:
            self._failures_left -= 1
            self.transient_errors += 1
            return {"error": "refund service unavailable (503); try again", "transient": True}
        cursor = self._db.execute(
            "INSERT INTO refunds (order_id, amount_cents, issued_in_episode) VALUES (?, ?, 1)",
            (order["order_id"], amount_cents),
        )
        return {
            "refund_id": f"R-{cursor.lastrowid}",
            "order_id": order["order_id"],
            "status": "issued",
        }

    def refunds_issued(self) -> list[Refund]:
        """The refunds this episode wrote."""
        rows = self._db.execute(
            "SELECT order_id, amount_cents FROM refunds WHERE issued_in_episode = 1 ORDER BY id"
        ).fetchall()
        return [Refund(order_id, amount) for order_id, amount in rows]

    def close(self) -> None:
        self._db.close()


def _text(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise BadRequest(f"{name} must be a string")
    return value
