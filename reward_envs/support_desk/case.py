"""A support-desk case: a customer asks for a refund of one order.

The case is data (a dataset record's `metadata.info`, or drawn from a seed): the customer, the
orders in the shop's database, the order asked about, and how many times the refund service
fails with a transient error before it works. `truth` says what a correct agent does.

The refund policy: an order is refunded in full when it was delivered, within the customer's
tier's window (standard 30 days, gold 60), to the customer who asks, and not refunded before.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

WINDOW_DAYS = {"standard": 30, "gold": 60}
ITEMS = (
    "kettle",
    "desk lamp",
    "pair of headphones",
    "backpack",
    "blender",
    "monitor",
    "rain jacket",
)
NAMES = ("Ana Ruiz", "Ben Okafor", "Chen Wei", "Dara Novak", "Eli Haddad", "Fatima Sy")
# What can make a request wrong to grant; "grant" is the case that is right to grant. Half the
# cases are to grant, so neither always granting nor always denying pays.
Variant = Literal["grant", "too_late", "not_delivered", "already_refunded", "not_their_order"]
VARIANTS: tuple[Variant, ...] = (
    "grant", "grant", "grant", "grant",
    "too_late", "not_delivered", "already_refunded", "not_their_order",
)  # fmt: skip


@dataclass(frozen=True)
class Order:
    id: str
    customer_id: str
    item: str
    amount_cents: int
    status: Literal["delivered", "shipped"]
    delivered_days_ago: int | None
    refunded: bool = False


@dataclass(frozen=True)
class Case:
    customer_id: str
    customer_name: str
    tier: Literal["standard", "gold"]
    order_id: str
    orders: tuple[Order, ...]
    transient_failures: int = 0  # the refund service's failures before it works

    @property
    def order(self) -> Order | None:
        return next((order for order in self.orders if order.id == self.order_id), None)

    def refund_allowed(self) -> bool:
        order = self.order
        return order is not None and policy_allows(
            asking_customer=self.customer_id,
            order_customer=order.customer_id,
            status=order.status,
            delivered_days_ago=order.delivered_days_ago,
            refunded=order.refunded,
            window_days=WINDOW_DAYS[self.tier],
        )

    def task(self) -> str:
        order = self.order
        item = f" (a {order.item})" if order else ""
        return (
            f"Customer {self.customer_name} ({self.customer_id}) asks for a refund of order "
            f"{self.order_id}{item}. Check the order, the customer and the refund policy with "
            "the tools; issue the refund if the policy allows it, otherwise do not. End with "
            "finish(decision, message): decision 'refunded' or 'denied', and the message to the "
            "customer."
        )

    def as_info(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_info(cls, info: Mapping[str, Any] | str) -> Case:
        """A case from a record's `metadata.info` (an object or its JSON text); ValueError when
        it is not one."""
        data = json.loads(info) if isinstance(info, str) else dict(info)
        try:
            orders = tuple(Order(**order) for order in data.pop("orders"))
            case = cls(orders=orders, **data)
        except (KeyError, TypeError) as error:
            raise ValueError(f"metadata.info is not a support-desk case ({error})") from None
        if case.tier not in WINDOW_DAYS:
            raise ValueError(f"metadata.info.tier must be one of {sorted(WINDOW_DAYS)}")
        return case


def policy_allows(
    *,
    asking_customer: Any,
    order_customer: Any,
    status: Any,
    delivered_days_ago: Any,
    refunded: Any,
    window_days: Any,
) -> bool:
    """The refund policy: the case's truth (`Case.refund_allowed`) and an agent's reading of the
    tools' answers (notes.py) both ask it."""
    return (
        order_customer == asking_customer
        and status == "delivered"
        and isinstance(delivered_days_ago, int)
        and isinstance(window_days, int)
        and delivered_days_ago <= window_days
        and not refunded
    )


def draw_case(rng: random.Random, variant: Variant | None = None) -> Case:
    """A case of `variant` (drawn when None), with a few other customers' orders around it."""
    variant = variant or rng.choice(VARIANTS)
    tier = rng.choice(("standard", "gold"))
    customer, other = (f"C-{n}" for n in rng.sample(range(1000, 10000), 2))
    window = WINDOW_DAYS[tier]
    days = {
        "too_late": rng.randrange(window + 1, window + 90),
    }.get(variant, rng.randrange(1, window + 1))
    decoy_count = rng.randrange(1, 4)
    asked_id, *decoy_ids = (f"O-{n}" for n in rng.sample(range(10000, 100000), 1 + decoy_count))
    asked = Order(
        id=asked_id,
        customer_id=other if variant == "not_their_order" else customer,
        item=rng.choice(ITEMS),
        amount_cents=rng.randrange(999, 49999),
        status="shipped" if variant == "not_delivered" else "delivered",
        delivered_days_ago=None if variant == "not_delivered" else days,
        refunded=variant == "already_refunded",
    )
    decoys = tuple(
        Order(
            id=decoy_id,
            customer_id=rng.choice((customer, other)),
            item=rng.choice(ITEMS),
            amount_cents=rng.randrange(999, 49999),
            status="delivered",
            delivered_days_ago=rng.randrange(1, 120),
        )
        for decoy_id in decoy_ids
    )
    orders = tuple(sorted((asked, *decoys), key=lambda order: order.id))
    return Case(
        customer_id=customer,
        customer_name=rng.choice(NAMES),
        tier=tier,
        order_id=asked.id,
        orders=orders,
        transient_failures=rng.choice((0, 0, 1, 2)),
    )
