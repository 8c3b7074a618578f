"""The reward-environment interface every environment implements, Wordle included.

An `Environment` is configuration only: it holds no per-episode state, so one object serves
any number of concurrent episodes. `reset` starts an `Episode` (the per-rollout state) from a
dataset record and returns the first messages; `Episode.step` takes the model's reply and
returns the observation messages, the turn reward and whether the episode is over. The episode
reward is `Environment.aggregate(turn rewards)`, always inside `reward_range`.

Messages are OpenAI chat messages: `{"role": "system" | "user" | "assistant", "content": str}`.

A step's `info` travels with the rollout's report as metrics (`env/<key>`, numbers and flags
only). On the turn that ends an episode, set `info["success"]` (a bool) when the task has a
notion of success (Wordle: solved): the pipeline's pass rates count it
(`domain.protocol.SUCCESS_METRIC`).
"""

from __future__ import annotations

import math
import random
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict


class Message(TypedDict):
    role: str
    content: str


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


class Episode(ABC):
    """The state of one rollout. Not shared between rollouts."""

    @abstractmethod
    def step(self, reply: str) -> StepResult:
        """Take the model's reply (the assistant message's content); never raises on bad replies."""


class Environment(ABC):
    """A reward environment. Subclass it, or return an instance from `load_environment()`."""

    name: str = "environment"
    reward_range: RewardRange = RewardRange()
    max_turns: int = 10

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

    def example_reply(self, messages: Sequence[Message], rng: random.Random) -> str:
        """A plausible reply for automated checks; environments may offer a smarter one."""
        return rng.choice(["", "I do not know.", "yes", "no", "42"])
