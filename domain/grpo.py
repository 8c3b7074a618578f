"""What every GRPO trainer of ours does with a step's rollout responses, before its own update:
group-relative advantages, and the step's metrics line (the same schema from the local policy
and the open-weights trainer, so status, run health and the reports read both)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np

from domain.episodes import TRUNCATED_METRIC
from domain.protocol import RolloutResponse
from domain.step_metrics import first_error
from training_configs.schema import AdvantageNormalization as Normalization


def group_advantages(
    rewards: Sequence[float], *, normalization: Normalization = "std", epsilon: float = 1e-6
) -> np.ndarray:
    """Each reward against its group's; all zeros when the group's rewards do not vary."""
    values = np.asarray(rewards, dtype=np.float64)
    spread = values.std()
    if spread < epsilon:
        return np.zeros_like(values)
    centred = values - values.mean()
    return centred / (spread + epsilon) if normalization == "std" else centred


@dataclass(frozen=True)
class ScoredRollout:
    sample_id: str
    reward: float
    advantage: float


@dataclass(frozen=True)
class RolloutStats:
    # None: no rollout of the step scored (all failed): nothing learned, the step still counted,
    # for run health (domain/health.py) to judge.
    mean_reward: float | None
    max_reward: float | None
    reward_std: float | None  # the spread of the scored rollouts' rewards
    win_rate: float | None
    zero_variance_groups: float | None
    turns_per_episode: float | None
    rollouts: int  # scored ones
    rollouts_asked: int  # what run health divides by (domain/health.py)
    failed_rollouts: int
    env_error_rollouts: int  # of the failed: the environment raised
    timeout_rollouts: int  # of the failed: timed out, or no answer within the step's wait
    truncated_rollouts: int  # answered, with a model turn cut at the token limit
    first_error: str | None = None  # the first failed rollout's error (domain/step_metrics.py)


def score_groups(
    groups: Mapping[str, Sequence[str]],
    responses: Mapping[str, RolloutResponse],
    *,
    normalization: Normalization = "std",
    penalise_truncated: bool = False,
) -> tuple[list[ScoredRollout], RolloutStats]:
    """The rollouts that learn (those of groups with two or more rewards, with their advantages)
    and the step's statistics. A rollout that failed or never came back carries no reward: it is
    left out of its group and counted, never scored as 0. `penalise_truncated`: a rollout with
    a turn cut at the token limit takes its group's lowest reward for its advantage (its own
    stays in the statistics)."""
    scored: list[ScoredRollout] = []
    wins, turns = [], []
    flat_groups = 0
    for samples in groups.values():
        rewarded = _rewarded(samples, responses)
        if len(rewarded) < 2:
            continue
        advantages = group_advantages(
            _learning_rewards(rewarded, responses, penalise_truncated=penalise_truncated),
            normalization=normalization,
        )
        flat_groups += int(not advantages.any())
        for (sample, reward), advantage in zip(rewarded, advantages, strict=True):
            scored.append(ScoredRollout(sample, reward, float(advantage)))
            metrics = {m.name: m.value for m in responses[sample].metrics}
            turns.append(metrics.get("turns", 0.0))
            succeeded = responses[sample].succeeded  # the environment's success flag
            if succeeded is not None:
                wins.append(float(succeeded))
    rewards = [rollout.reward for rollout in scored]
    asked = [sample for samples in groups.values() for sample in samples]
    ended = [responses[sample].stop_reason for sample in asked if sample in responses]
    unscored = [
        sample
        for sample in asked
        if sample not in responses or responses[sample].aggregate_score is None
    ]
    stats = RolloutStats(
        mean_reward=float(np.mean(rewards)) if rewards else None,
        max_reward=float(np.max(rewards)) if rewards else None,
        reward_std=float(np.std(rewards)) if rewards else None,
        win_rate=float(np.mean(wins)) if wins else None,
        zero_variance_groups=flat_groups / len(groups) if rewards else None,
        turns_per_episode=float(np.mean(turns)) if rewards else None,
        rollouts=len(rewards),
        rollouts_asked=len(asked),
        failed_rollouts=len(unscored),
        env_error_rollouts=ended.count("env_error"),
        timeout_rollouts=ended.count("timeout") + len(asked) - len(ended),
        truncated_rollouts=sum(
            1 for sample in asked if sample in responses and truncated(responses[sample])
        ),
        first_error=first_error(
            responses[sample].error if sample in responses else "no rollout response in time"
            for sample in unscored
        ),
    )
    return scored, stats


def _rewarded(
    samples: Sequence[str], responses: Mapping[str, RolloutResponse]
) -> list[tuple[str, float]]:
    """The group's rollouts that came back with a score, and their scores."""
    return [
        (sample, float(responses[sample].aggregate_score))  # type: ignore[arg-type]
        for sample in samples
        if sample in responses and responses[sample].aggregate_score is not None
    ]


def _learning_rewards(
    rewarded: Sequence[tuple[str, float]],
    responses: Mapping[str, RolloutResponse],
    *,
    penalise_truncated: bool,
) -> list[float]:
    """The rewards a group's advantages come from: its rollouts' own, a truncated one's the
    group's lowest where `penalise_truncated` (no cut answer beats a finished one)."""
    rewards = [reward for _, reward in rewarded]
    if not penalise_truncated or not rewards:
        return rewards
    lowest = min(rewards)
    return [lowest if truncated(responses[sample]) else reward for sample, reward in rewarded]


def truncated(response: RolloutResponse) -> bool:
    """Whether a model turn of the rollout was cut at the token limit."""
    return any(m.name == TRUNCATED_METRIC and m.value > 0 for m in response.metrics)


def learning_groups(
    groups: Mapping[str, Sequence[str]],
    responses: Mapping[str, RolloutResponse],
    *,
    penalise_truncated: bool = False,
) -> int:
    """How many groups an update learns from: two or more of their rollouts scored, and the
    rewards their advantages come from (`score_groups`) not all the same."""
    learning = 0
    for samples in groups.values():
        scores = _learning_rewards(
            _rewarded(samples, responses), responses, penalise_truncated=penalise_truncated
        )
        learning += len(scores) > 1 and bool(group_advantages(scores).any())
    return learning


def flat_group_samples(
    groups: Mapping[str, Sequence[str]], scored: Sequence[ScoredRollout]
) -> set[str]:
    """The scored rollouts of groups whose rewards did not vary (every advantage zero): no
    policy gradient comes from them."""
    advantage = {rollout.sample_id: rollout.advantage for rollout in scored}
    flat = set()
    for samples in groups.values():
        found = [sample for sample in samples if sample in advantage]
        if found and not any(advantage[sample] for sample in found):
            flat.update(found)
    return flat


@dataclass(frozen=True)
class UpdateStats:
    """An update's figures. The open-weights trainer's token-level ones (None from a trainer
    that does not measure them) are shares of the step's sampled tokens, or per token."""

    objective: float  # the GRPO objective maximised (clipped surrogate less the KL penalty)
    kl: float
    clipped_fraction: float  # of the sampled replies or tokens, those whose ratio was clipped
    clipped_low: float | None = None  # A < 0 and the ratio under 1 − ε_low
    clipped_high: float | None = None  # A > 0 and the ratio over 1 + ε_high
    dual_clipped: float | None = None  # A < 0 and the ratio over the dual clip
    masked_fraction: float | None = None  # left out of the objective: a ratio outside its band
    grad_norm: float | None = None  # the gradient's global norm, before clipping
    entropy: float | None = None  # of the policy's sampling distribution, per sampled token
    # Sampler against trainer, at the update's start: the k3 estimate of KL(μ‖π) per token, the
    # importance ratio π/μ's quantiles and |log π − log μ|'s.
    mismatch_kl: float | None = None
    ratio_p1: float | None = None
    ratio_p50: float | None = None
    ratio_p99: float | None = None
    logprob_gap_p50: float | None = None
    logprob_gap_p99: float | None = None
    logprob_gap_max: float | None = None


@dataclass(frozen=True)
class StepMetrics:
    """One training step, as its line of `metrics.jsonl`: the rollouts' statistics, the update's
    (None when nothing was learned), times, and what the trainer adds of its own (`extra`)."""

    step: int
    stats: RolloutStats
    update: UpdateStats | None
    seconds: float
    # Epoch seconds: the step's rollouts finished between the two (`mtrl trajectories --step`).
    started_at: float
    finished_at: float
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def mean_reward(self) -> float | None:
        return self.stats.mean_reward

    def line(self) -> dict[str, Any]:
        update = (
            asdict(self.update)
            if self.update
            else dict.fromkeys(f.name for f in fields(UpdateStats))
        )
        return {
            "step": self.step,
            **asdict(self.stats),
            **update,
            "seconds": self.seconds,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            **self.extra,
        }
