"""IAM's evaluation of identity policies, for one request at a time: explicit Deny wins, then
any Allow, else denied. Actions and NotAction match case-insensitively with `*` and `?`;
Resource and NotResource case-sensitively; conditions with the operators our templates use
(a key the request does not carry fails a condition unless the operator ends in IfExists).
Source: IAM User Guide, "Policy evaluation logic" and "IAM JSON policy elements: Condition
operators"."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any


@dataclass(frozen=True)
class Request:
    """One authorization IAM makes: an action on a resource, with the request's context keys."""

    action: str
    resource: str
    context: Mapping[str, str | list[str]] = field(default_factory=dict)

    def __hash__(self) -> int:
        return hash((self.action, self.resource, tuple(sorted(map(str, self.context.items())))))


@dataclass(frozen=True)
class Grant:
    """One (action pattern, resource pattern) pair of an Allow statement: the unit that is
    used or unused."""

    policy: str
    statement: int
    action: str
    resource: str


@dataclass(frozen=True)
class Decision:
    allowed: bool
    grants: tuple[Grant, ...] = ()  # the Allow pairs that match (all of them)
    denied_by: str | None = None


@cache
def _pattern(text: str, ignore_case: bool) -> re.Pattern[str]:
    regex = "".join(
        ".*" if char == "*" else "." if char == "?" else re.escape(char) for char in text
    )
    return re.compile(regex, re.DOTALL | (re.IGNORECASE if ignore_case else 0))


def matches(pattern: str, value: str, *, ignore_case: bool = False) -> bool:
    """IAM wildcards: `*` any run of characters, `?` one character; nothing else is special."""
    return bool(_pattern(pattern, ignore_case).fullmatch(value))


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


class UnsupportedCondition(ValueError):
    """A condition operator the proof cannot evaluate: extend `_condition_holds`."""


def _condition_holds(operator: str, key: str, expected: list[Any], context: Mapping) -> bool:
    if_exists = operator.endswith("IfExists")
    base = operator.removesuffix("IfExists")
    qualifier, _, base = base.rpartition(":")
    if key not in context:
        return if_exists or base.startswith(("StringNot", "ArnNot"))
    values = [str(v) for v in as_list(context[key])]
    expected_text = [str(e).lower() if base == "Bool" else str(e) for e in expected]

    def one(value: str) -> bool:
        if base in ("StringEquals", "ArnEquals"):
            return value in expected_text
        if base == "StringEqualsIgnoreCase":
            return value.lower() in {e.lower() for e in expected_text}
        if base in ("StringLike", "ArnLike"):
            return any(matches(e, value) for e in expected_text)
        if base in ("StringNotEquals", "ArnNotEquals"):
            return value not in expected_text
        if base in ("StringNotLike", "ArnNotLike"):
            return not any(matches(e, value) for e in expected_text)
        if base == "Bool":
            return value.lower() in expected_text
        raise UnsupportedCondition(operator)

    if qualifier == "ForAllValues":
        return all(one(v) for v in values)
    if base.startswith(("StringNot", "ArnNot")) and qualifier != "ForAnyValue":
        return all(one(v) for v in values)
    return any(one(v) for v in values)


def conditions_hold(conditions: Mapping[str, Mapping[str, Any]], context: Mapping) -> bool:
    return all(
        _condition_holds(operator, key, as_list(expected), context)
        for operator, keys in conditions.items()
        for key, expected in keys.items()
    )


@dataclass(frozen=True)
class Statement:
    policy: str  # where it comes from, for messages
    index: int
    effect: str
    actions: tuple[str, ...]
    not_actions: tuple[str, ...]
    resources: tuple[str, ...]
    not_resources: tuple[str, ...]
    conditions: Mapping[str, Mapping[str, Any]]

    @classmethod
    def parse(cls, policy: str, index: int, raw: Mapping[str, Any]) -> Statement:
        return cls(
            policy=policy,
            index=index,
            effect=raw["Effect"],
            actions=tuple(as_list(raw.get("Action", []))),
            not_actions=tuple(as_list(raw.get("NotAction", []))),
            resources=tuple(as_list(raw.get("Resource", []))),
            not_resources=tuple(as_list(raw.get("NotResource", []))),
            conditions=raw.get("Condition", {}),
        )

    def matching_actions(self, action: str) -> list[str]:
        if self.not_actions:
            return (
                []
                if any(matches(p, action, ignore_case=True) for p in self.not_actions)
                else ["NotAction"]
            )
        return [p for p in self.actions if matches(p, action, ignore_case=True)]

    def matching_resources(self, resource: str) -> list[str]:
        if self.not_resources:
            return [] if any(matches(p, resource) for p in self.not_resources) else ["NotResource"]
        return [p for p in self.resources if matches(p, resource)]

    def grants(self) -> Iterable[Grant]:
        for action in self.actions or ("NotAction",):
            for resource in self.resources or ("NotResource",):
                yield Grant(self.policy, self.index, action, resource)


class Policies:
    """The identity policies of one principal."""

    def __init__(self, statements: Iterable[Statement]) -> None:
        self.statements = list(statements)

    def evaluate(self, request: Request) -> Decision:
        allowed: list[Grant] = []
        for statement in self.statements:
            actions = statement.matching_actions(request.action)
            resources = statement.matching_resources(request.resource)
            if not actions or not resources:
                continue
            if not conditions_hold(statement.conditions, request.context):
                continue
            if statement.effect == "Deny":
                return Decision(False, denied_by=f"{statement.policy}#{statement.index}")
            allowed.extend(
                Grant(statement.policy, statement.index, a, r) for a in actions for r in resources
            )
        return Decision(bool(allowed), tuple(allowed))

    def allows_action(self, action: str) -> bool:
        """Whether some Allow statement grants `action` at all (on whatever resource)."""
        return any(
            statement.effect == "Allow" and statement.matching_actions(action)
            for statement in self.statements
        )

    def grants(self) -> set[Grant]:
        return {g for s in self.statements if s.effect == "Allow" for g in s.grants()}
