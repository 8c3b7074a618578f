"""Wordle made sick on purpose, for run-health tests (a config names this file as its
environment; `environment_args.sickness` says how):

- same_reward: every episode earns 0.5, so no GRPO group has a learning signal;
- flaky: the environment raises on half the records (by id), so half the rollouts end in an
  environment error;
- down: the environment raises on every record.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from reward_envs.interface import Message, Record
from reward_envs.wordle import WordleEnvironment
from reward_envs.wordle.env import WordleEpisode


class SameRewardWordle(WordleEnvironment):
    def aggregate(self, turn_rewards: Sequence[float]) -> float:
        return 0.5


class FlakyWordle(WordleEnvironment):
    def reset(self, record: Record, *, seed: int = 0) -> tuple[WordleEpisode, list[Message]]:
        if hashlib.sha256(record.id.encode()).digest()[0] % 2:
            raise ConnectionError(f"record {record.id}: the environment's backend is down")
        return super().reset(record, seed=seed)


class DownWordle(WordleEnvironment):
    def reset(self, record: Record, *, seed: int = 0) -> tuple[WordleEpisode, list[Message]]:
        raise ConnectionError("the environment's backend is down")


def load_environment(sickness: str) -> WordleEnvironment:
    sick = {"same_reward": SameRewardWordle, "flaky": FlakyWordle, "down": DownWordle}
    return sick[sickness]()
