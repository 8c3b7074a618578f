"""A bring-your-own environment small enough for a tiny language model to learn: each turn the
model is asked to write a letter as often as it can, and the turn's reward is the share of its
reply that is that letter. Two turns; the episode reward is their mean (0–1); an episode
succeeds when a quarter of the last reply is the letter.

It exists to show the open-weights trainer learning end to end on a CPU
(`mtrl local examples/letters/train.jsonl --config examples/letters/config.yaml --trainer llm
--model tiny`); any real task works the same way.
"""

from __future__ import annotations

import string
from collections.abc import Sequence

from reward_envs.interface import Environment, Episode, Message, Record, StepResult

TURNS = 2


def share_of(letter: str, reply: str) -> float:
    """How much of `reply` (ignoring white space) is `letter`."""
    text = "".join(reply.split())
    return text.count(letter) / len(text) if text else 0.0


class LettersEpisode(Episode):
    def __init__(self, letter: str) -> None:
        self.letter, self.turn = letter, 0

    def step(self, reply: str) -> StepResult:
        self.turn += 1
        share = share_of(self.letter, reply)
        done = self.turn >= TURNS
        info = {"share": share, **({"success": share >= 0.25} if done else {})}
        follow_up: list[Message] = (
            [] if done else [{"role": "user", "content": f"Again: write {self.letter!r} only."}]
        )
        return StepResult(follow_up, share / TURNS, done, info)


class Letters(Environment):
    name = "letters"
    max_turns = TURNS
    version = "1"

    def reset(self, record: Record, *, seed: int = 0) -> tuple[Episode, list[Message]]:
        letter = str(record.metadata.get("answer", "e"))
        prompt = f"Write the letter {letter!r} as many times as you can."
        return LettersEpisode(letter), [{"role": "user", "content": prompt}]

    def aggregate(self, turn_rewards: Sequence[float]) -> float:
        return self.reward_range.clamp(sum(turn_rewards))

    def example_records(self, count: int, *, seed: int = 0) -> list[Record]:
        letters = string.ascii_lowercase
        return [Record(f"letters-{i}", {"answer": letters[(seed + i) % 26]}) for i in range(count)]


def load_environment(**_: object) -> Letters:
    return Letters()
