"""GRPO with the episodes played in this process: no pipeline, no queues, no workers.

What the learning itself costs and achieves; the benchmark's baseline for local mode
(bench/local.py) and the check that the update learns (tests/local/test_trainer.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from domain.grpo import group_advantages
from local_trainer.grpo import Adam, Episode, objective_and_gradient
from local_trainer.policy import Decision, Policy
from reward_envs.interface import Environment, Record, Reply, closed_after


@dataclass(frozen=True)
class DirectStep:
    seconds: float
    mean_reward: float


def play(
    environment: Environment,
    policy: Policy,
    params: np.ndarray,
    record: Record,
    rng: np.random.Generator,
) -> tuple[list[Decision], float]:
    """One episode: the policy's decisions and the episode's reward."""
    episode, messages = environment.reset(record)
    messages, decisions, rewards = list(messages), [], []
    with closed_after(episode):
        while True:
            decision = policy.decide(params, messages, rng)
            decisions.append(decision)
            reply = Reply.of(decision.reply, environment.tools)
            result = episode.act(reply)
            rewards.append(result.reward)
            messages += [reply.message, *result.messages]
            if result.done:
                return decisions, environment.aggregate(rewards)


def train(
    environment: Environment,
    policy: Policy,
    records: list[Record],
    *,
    steps: int,
    group_size: int,
    records_per_step: int,
    learning_rate: float,
    clip_ratio: float = 0.2,
    seed: int = 0,
) -> list[DirectStep]:
    rng = np.random.default_rng(seed)
    params, optimizer = policy.initial_params(), Adam(learning_rate)
    results = []
    for _ in range(steps):
        started, episodes, rewards = time.perf_counter(), [], []
        for index in rng.choice(len(records), size=records_per_step):
            group = [
                play(environment, policy, params, records[int(index)], rng)
                for _ in range(group_size)
            ]
            advantages = group_advantages([reward for _, reward in group])
            episodes += [Episode(d, a) for (d, _), a in zip(group, advantages, strict=True)]
            rewards += [reward for _, reward in group]
        _, gradient, _ = objective_and_gradient(params, episodes, clip_ratio=clip_ratio)
        params = optimizer.step(params, gradient)
        results.append(DirectStep(time.perf_counter() - started, float(np.mean(rewards))))
    return results
