"""The reward-environment interface every environment implements, Wordle included.

An `Environment` is configuration only: it holds no per-episode state, so one object serves
any number of concurrent episodes. `reset` starts an `Episode` (the per-rollout state) from a
dataset record and returns the first messages; `Episode.step` takes the model's reply and
returns the observation messages, the turn reward and whether the episode is over. The episode
reward is `Environment.aggregate(turn rewards)`, always inside `reward_range`.

Messages are OpenAI chat messages: `{"role": "system" | "user" | "assistant" | "tool",
"content": str}`, and for tools OpenAI's `tool_calls` and `tool_call_id` (domain/chat.py).

Tools: an environment that offers tools lists their OpenAI definitions in `tools` (each
`{"type": "function", "function": {"name", "description", "parameters"}}`); the worker sends
them with every model request, and the episode's `act` gets the model's turn as a `Reply`: its
text and its tool calls, parsed, each with the `problem` that makes it unusable (unknown tool,
arguments that are not a JSON object) — a model's mistake reaches the environment as such, to
be answered and penalised, never raised. An environment answers a call with `tool_result`. A
text-only environment implements `step(reply)` and ignores the rest.

A step's `info` travels with the rollout's report as metrics (`env/<key>`, numbers and flags
only). On the turn that ends an episode, set `info["success"]` (a bool) when the task has a
notion of success (Wordle: solved): the pipeline's pass rates count it
(`domain.protocol.SUCCESS_METRIC`).
"""

from __future__ import annotations

import contextlib
import json
import math
import random
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Required, TypedDict


class Message(TypedDict, total=False):
    role: Required[str]
    content: str | None
    tool_calls: list[dict[str, Any]]
    tool_call_id: str


@dataclass(frozen=True)
class ToolUse:
    """One tool call of the model's turn, as the environment sees it. `arguments`: the parsed
    JSON object, None when `problem` says why there is none."""

    id: str
    name: str
    arguments: dict[str, Any] | None
    raw_arguments: str
    problem: str | None = None


@dataclass(frozen=True)
class Reply:
    """The model's turn: `message` as it came (what the conversation keeps), its text
    (`content`, "" when null) and its tool calls."""

    message: Message
    content: str
    tool_calls: tuple[ToolUse, ...] = ()

    @classmethod
    def of(cls, reply: str | Message, tools: Sequence[Mapping[str, Any]] = ()) -> Reply:
        """A reply from the model's text or its assistant message, its tool calls checked
        against `tools` (the environment's definitions)."""
        if isinstance(reply, str):
            return cls({"role": "assistant", "content": reply}, reply)
        known = {tool.get("function", {}).get("name") for tool in tools}
        content = reply.get("content")
        calls = tuple(
            _tool_use(call, index, known)
            for index, call in enumerate(reply.get("tool_calls") or [])
        )
        return cls(reply, content if isinstance(content, str) else "", calls)


def _tool_use(call: Any, index: int, known: set[Any]) -> ToolUse:
    function = call.get("function") if isinstance(call, dict) else None
    function = function if isinstance(function, dict) else {}
    call_id = call.get("id") if isinstance(call, dict) else None
    call_id = call_id if isinstance(call_id, str) and call_id else f"call_{index}"
    name = function.get("name")
    raw = function.get("arguments")
    raw = raw if isinstance(raw, str) else json.dumps(raw)
    if not isinstance(name, str) or not name:
        return ToolUse(call_id, "", None, raw, "the call names no tool")
    if name not in known:
        names = ", ".join(sorted(str(tool) for tool in known if tool)) or "none"
        return ToolUse(call_id, name, None, raw, f"unknown tool {name!r} (tools: {names})")
    try:
        arguments = json.loads(raw) if raw.strip() else {}
    except json.JSONDecodeError as error:
        return ToolUse(call_id, name, None, raw, f"arguments are not JSON ({error.msg})")
    if not isinstance(arguments, dict):
        return ToolUse(call_id, name, None, raw, "arguments must be a JSON object")
    return ToolUse(call_id, name, arguments, raw)


def tool_turn(name: Any, arguments: Any, *, call_id: str, content: str | None = None) -> Message:
    """An assistant turn that calls one tool, as a model writes it (`arguments`: its JSON text,
    or whatever a broken model sends)."""
    function = {"name": name, "arguments": arguments}
    return {
        "role": "assistant",
        "content": content,
        "tool_calls": [{"id": call_id, "type": "function", "function": function}],
    }


def tool_result(call: ToolUse, content: Any) -> Message:
    """The tool message answering `call` (`content` as JSON unless it is text)."""
    text = content if isinstance(content, str) else json.dumps(content, sort_keys=True)
    return {"role": "tool", "tool_call_id": call.id, "content": text}


@dataclass(frozen=True)
class Record:
    """What an environment sees of one dataset line: its `id` and `metadata`."""

    id: str
    metadata: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RewardRange:
    low: float = 0.0
    high: float = 1.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.low) and math.isfinite(self.high) and self.low < self.high):
            raise ValueError(f"a reward range needs finite low < high, got {self.low}, {self.high}")

    def __contains__(self, value: object) -> bool:
        return isinstance(value, int | float) and self.low <= value <= self.high

    def clamp(self, value: float) -> float:
        return min(self.high, max(self.low, value))


@dataclass(frozen=True)
class StepResult:
    """What the environment answers to one model reply."""

    messages: list[Message]
    reward: float
    done: bool
    info: dict[str, Any] = field(default_factory=dict)


class Episode:
    """The state of one rollout. Not shared between rollouts."""

    def step(self, reply: str) -> StepResult:
        """Take the model's reply (the assistant message's content); never raises on bad replies.
        A text environment implements this; one with tools implements `act`."""
        raise NotImplementedError(f"{type(self).__name__} implements neither step nor act")

    def act(self, reply: Reply) -> StepResult:
        """Take the model's whole turn, tool calls included; by default its text, to `step`."""
        return self.step(reply.content)

    def close(self) -> None:
        """Let go of what the episode holds (a server's session, a process): called once, however
        the episode ended (done, its turn limit, a timeout, an error). By default nothing."""


def close_quietly(episode: Episode) -> None:
    """Close `episode`; a close that fails is not the episode's failure."""
    with contextlib.suppress(Exception):
        episode.close()


@contextmanager
def closed_after(episode: Episode) -> Iterator[Episode]:
    """`episode` for the block, closed when the block ends, however it ends."""
    try:
        yield episode
    finally:
        close_quietly(episode)


class Environment(ABC):
    """A reward environment. Subclass it, or return an instance from `load_environment()`."""

    name: str = "environment"
    reward_range: RewardRange = RewardRange()
    max_turns: int = 10
    tools: Sequence[Mapping[str, Any]] = ()  # OpenAI tool definitions the model may call
    # At most this many episodes at once (a server's sessions); None: as many as asked for.
    concurrent_episodes: int | None = None
    # Change it when the rewards change: every trajectory records it, so runs compare fairly.
    version: str | None = None

    @abstractmethod
    def reset(self, record: Record, *, seed: int = 0) -> tuple[Episode, list[Message]]:
        """Start an episode for `record`; the same record and seed give the same episode."""

    def aggregate(self, turn_rewards: Sequence[float]) -> float:
        """The episode reward from the turn rewards: their sum, kept inside `reward_range`."""
        return self.reward_range.clamp(math.fsum(turn_rewards))

    def example_records(self, count: int, *, seed: int = 0) -> list[Record]:
        """Records to try the environment on (the conformance kit and `mtrl env play` use them)."""
        raise NotImplementedError(
            f"{type(self).__name__} has no example records: pass a dataset (--data FILE.jsonl)"
        )

    def example_reply(self, messages: Sequence[Message], rng: random.Random) -> str | Message:
        """A plausible reply (text, or an assistant message with tool calls) for automated
        checks; environments may offer a smarter one."""
        return rng.choice(["", "I do not know.", "yes", "no", "42"])
