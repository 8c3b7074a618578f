"""The preflight: rollouts of a dataset against a real model, without training.

GRPO learns from the differences between the rewards of one group (the rollouts of one
sample). If a model gets the same reward on every rollout of most samples — all fail, or all
succeed — a paid run has nothing to learn from. This plays `group_size` rollouts per record
against any OpenAI-compatible server (vLLM, Ollama, a Bedrock gateway) with the real
environment and rollout runner, and reports the reward distribution and the share of groups
whose rewards do not vary.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from domain.dataset import DatasetRecord
from domain.protocol import RewardSpec, RolloutRequest, RolloutResponse, sample_id_for
from reward_envs.interface import Environment
from reward_envs.worker.model_client import ModelClient
from reward_envs.worker.rollout import play_rollout

FLAT_SPREAD = 1e-6


@dataclass(frozen=True)
class Preflight:
    records: int
    group_size: int
    responses: list[RolloutResponse]
    groups: dict[str, list[float]]  # record id -> rewards of its scored rollouts

    @property
    def rewards(self) -> list[float]:
        return [r for rewards in self.groups.values() for r in rewards]

    @property
    def zero_variance_share(self) -> float:
        scored = [rewards for rewards in self.groups.values() if len(rewards) >= 2]
        if not scored:
            return 1.0
        flat = sum(1 for rewards in scored if max(rewards) - min(rewards) < FLAT_SPREAD)
        return flat / len(scored)

    def summary(self) -> dict[str, Any]:
        rewards = sorted(self.rewards)
        quantiles = (
            statistics.quantiles(rewards, n=4, method="inclusive") if len(rewards) >= 2 else []
        )
        return {
            "records": self.records,
            "group_size": self.group_size,
            "rollouts": len(self.responses),
            "scored": len(rewards),
            "stop_reasons": dict(Counter(r.stop_reason for r in self.responses)),
            "reward": {
                "mean": statistics.fmean(rewards) if rewards else None,
                "stdev": statistics.pstdev(rewards) if rewards else None,
                "min": rewards[0] if rewards else None,
                "quartiles": quantiles,
                "max": rewards[-1] if rewards else None,
            },
            "zero_variance_groups": self.zero_variance_share,
            "errors": sorted({r.error for r in self.responses if r.error})[:5],
        }


def preflight(
    environment: Environment,
    model: ModelClient,
    records: Sequence[DatasetRecord],
    *,
    group_size: int,
    max_turns: int | None,
    timeout: float,
    concurrency: int = 8,
) -> Preflight:
    """`group_size` rollouts of every record against `model`, `concurrency` at a time."""
    reward_range = RewardSpec(range=(environment.reward_range.low, environment.reward_range.high))
    requests = [
        RolloutRequest(
            sample_id=sample_id_for(record.id, k), rewards=reward_range, data=record.rollout_data()
        )
        for record in records
        for k in range(group_size)
    ]

    def play(request: RolloutRequest) -> RolloutResponse:
        return play_rollout(
            environment, model, request, max_turns=max_turns, timeout=timeout
        ).response

    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="preflight") as pool:
        responses = list(pool.map(play, requests))
    groups: dict[str, list[float]] = {request.record_id: [] for request in requests}
    for request, response in zip(requests, responses, strict=True):
        if response.aggregate_score is not None:
            groups[request.record_id].append(response.aggregate_score)
    return Preflight(len(records), group_size, responses, groups)
