"""The conformance kit passes Wordle and fails purposely broken environments for the right reason."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from reward_envs.conformance import check_environment
from reward_envs.interface import Environment, Episode, Message, Record, RewardRange, StepResult
from reward_envs.wordle import load_environment


@dataclass
class CountingEpisode(Episode):
    """A correct little episode: three turns, reward 1/3 per "yes"."""

    turns: int = 0

    def step(self, reply: str) -> StepResult:
        self.turns += 1
        reward = 1 / 3 if reply == "yes" else 0.0
        return StepResult(
            [{"role": "user", "content": f"turn {self.turns}"}],
            reward,
            self.turns >= 3,
            {"turn": self.turns},
        )


class GoodEnvironment(Environment):
    name = "good"
    reward_range = RewardRange(0.0, 1.0)
    max_turns = 3

    def reset(self, record: Record, *, seed: int = 0) -> tuple[Episode, list[Message]]:
        return CountingEpisode(), [{"role": "user", "content": f"hello {record.id}"}]

    def example_records(self, count: int, *, seed: int = 0) -> list[Record]:
        return [Record(id=str(i)) for i in range(count)]

    def example_reply(self, messages: Sequence[Message], rng: random.Random) -> str:
        return rng.choice(["yes", "no"])


class CrashesOnGarbage(GoodEnvironment):
    def reset(self, record, *, seed=0):
        class Fragile(CountingEpisode):
            def step(self, reply):
                if reply not in ("yes", "no"):
                    raise ValueError("cannot parse")
                return super().step(reply)

        return Fragile(), [{"role": "user", "content": "hi"}]


class SharedState(GoodEnvironment):
    """Keeps the turn counter on the environment: episodes interfere."""

    turns = 0

    def reset(self, record, *, seed=0):
        environment = self

        class Leaky(Episode):
            def step(self, reply):
                environment.turns += 1
                return StepResult(
                    [{"role": "user", "content": f"turn {environment.turns}"}],
                    0.0,
                    environment.turns % 3 == 0,
                )

        return Leaky(), [{"role": "user", "content": "hi"}]


class RewardTooHigh(GoodEnvironment):
    def aggregate(self, turn_rewards):
        return 2.0


class TurnRewardsTooHigh(GoodEnvironment):
    """Half a point per turn, three turns: 1.5, which the default aggregate would clamp to 1."""

    def reset(self, record, *, seed=0):
        class Generous(CountingEpisode):
            def step(self, reply):
                result = super().step(reply)
                return StepResult(result.messages, 0.5, result.done, result.info)

        return Generous(), [{"role": "user", "content": "hi"}]


class NeverDone(GoodEnvironment):
    def reset(self, record, *, seed=0):
        class Endless(Episode):
            def step(self, reply):
                return StepResult([{"role": "user", "content": "again"}], 0.0, False)

        return Endless(), [{"role": "user", "content": "hi"}]


class Unseeded(GoodEnvironment):
    def reset(self, record, *, seed=0):
        return CountingEpisode(), [{"role": "user", "content": f"{random.random()}"}]


class BadInfo(GoodEnvironment):
    def reset(self, record, *, seed=0):
        class Sets(CountingEpisode):
            def step(self, reply):
                result = super().step(reply)
                return StepResult(result.messages, result.reward, result.done, {"seen": {1, 2}})

        return Sets(), [{"role": "user", "content": "hi"}]


class BadMessages(GoodEnvironment):
    def reset(self, record, *, seed=0):
        return CountingEpisode(), [{"role": "narrator", "content": "hi"}]


class NoExamples(GoodEnvironment):
    def example_records(self, count, *, seed=0):
        return Environment.example_records(self, count, seed=seed)


def _failures(environment: Environment, **kwargs) -> dict[str, str]:
    report = check_environment(environment, episodes=6, **kwargs)
    return {result.name: result.detail for result in report.results if not result.passed}


def test_wordle_passes_every_check() -> None:
    report = check_environment(load_environment())
    assert report.passed, report.summary()
    assert report.step_latency_ms["steps"] > 100


def test_a_correct_environment_passes() -> None:
    assert _failures(GoodEnvironment()) == {}


@pytest.mark.parametrize(
    ("environment", "check", "reason"),
    [
        (
            CrashesOnGarbage(),
            "garbage replies are answered, not raised",
            "raised ValueError: cannot parse",
        ),
        (SharedState(), "concurrent episodes do not share state", "changed"),
        (
            RewardTooHigh(),
            "episode reward inside reward_range",
            "episode reward 2.0 (before any clamp) is outside",
        ),
        (
            TurnRewardsTooHigh(),
            "episode reward inside reward_range",
            "(the sum of its turn rewards [0.5, 0.5, 0.5], before any clamp) is outside",
        ),
        (NeverDone(), "episode ends within max_turns", "not done after max_turns=3"),
        (
            Unseeded(),
            "same record, seed and replies give the same episode",
            "first messages differ",
        ),
        (
            BadInfo(),
            "step returns messages, finite reward, done, JSON info",
            "not JSON-serialisable",
        ),
        (BadMessages(), "reset returns JSON chat messages", "needs a role"),
    ],
)
def test_broken_environments_fail_for_the_right_reason(
    environment: Environment, check: str, reason: str
) -> None:
    failures = _failures(environment)
    assert check in failures, failures
    assert reason in failures[check]


def test_an_environments_exception_names_the_record_the_turn_and_its_line() -> None:
    detail = _failures(CrashesOnGarbage())["garbage replies are answered, not raised"]
    line = next(
        number
        for number, text in enumerate(Path(__file__).read_text().splitlines(), start=1)
        if 'raise ValueError("cannot parse")' in text
    )
    assert detail.startswith("record 0, garbage reply ")
    assert detail.endswith(f"raised ValueError: cannot parse at {__file__}:{line}")


def test_an_environment_without_records_asks_for_a_dataset() -> None:
    failures = _failures(NoExamples())
    assert "pass a dataset" in failures["has records to play"]
    assert not _failures(NoExamples(), records=[Record(id="a"), Record(id="b")])
