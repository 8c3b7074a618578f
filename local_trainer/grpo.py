"""GRPO for a linear softmax policy (advantages: domain/grpo.py): the clipped policy-gradient
objective with an optional KL penalty to a reference, and Adam. Plain NumPy, exact gradients.

For one reply with candidates' features F, chosen candidate a and parameters θ:
  log π(a) = F[a]·θ − logsumexp(F·θ),   ∇ log π(a) = F[a] − softmax(F·θ)ᵀF.
Per episode i with advantage A_i and the ratio r = π(a)/π_old(a) of each of its replies:
  objective = mean over replies of min(r·A_i, clip(r, 1−ε, 1+ε)·A_i) − β·KL,
with KL the k3 estimate exp(log π_ref − log π) − (log π_ref − log π) − 1; the batch objective
is the mean over episodes (each episode weighs the same however many turns it took).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from domain.grpo import UpdateStats
from local_trainer.policy import Decision, log_softmax


@dataclass(frozen=True)
class Episode:
    decisions: Sequence[Decision]
    advantage: float


def objective_and_gradient(
    params: np.ndarray,
    episodes: Sequence[Episode],
    *,
    clip_ratio: float,
    kl_coefficient: float = 0.0,
    reference: np.ndarray | None = None,
) -> tuple[float, np.ndarray, UpdateStats]:
    """The GRPO objective (to maximise) over `episodes`, its gradient, and what happened."""
    gradient = np.zeros_like(params)
    total, kl_total, clipped, replies = 0.0, 0.0, 0, 0
    counted = [episode for episode in episodes if episode.decisions]
    for episode in counted:
        weight = 1.0 / (len(episode.decisions) * len(counted))
        advantage = episode.advantage
        for decision in episode.decisions:
            features = decision.features.astype(np.float64)
            logprobs = log_softmax(features @ params)
            grad_logprob = features[decision.choice] - np.exp(logprobs) @ features
            logprob = logprobs[decision.choice]
            ratio = float(np.exp(logprob - decision.logprob))
            bounded = min(max(ratio, 1.0 - clip_ratio), 1.0 + clip_ratio)
            # The min picks the clipped term exactly when the ratio has moved past the bound in
            # the direction the advantage favours; there the objective is flat in θ.
            is_clipped = bounded * advantage < ratio * advantage
            total += weight * min(ratio * advantage, bounded * advantage)
            if is_clipped:
                clipped += 1
            else:
                gradient += weight * ratio * advantage * grad_logprob
            if kl_coefficient and reference is not None:
                reference_logprob = log_softmax(features @ reference)[decision.choice]
                delta = reference_logprob - logprob
                kl = float(np.exp(delta) - delta - 1.0)
                kl_total += weight * kl
                total -= weight * kl_coefficient * kl
                gradient -= weight * kl_coefficient * (1.0 - np.exp(delta)) * grad_logprob
            replies += 1
    stats = UpdateStats(
        objective=total, kl=kl_total, clipped_fraction=clipped / replies if replies else 0.0
    )
    return total, gradient, stats


@dataclass
class Adam:
    """Adam, ascending (the objective is maximised)."""

    learning_rate: float
    beta1: float = 0.9
    beta2: float = 0.999
    epsilon: float = 1e-8
    steps: int = 0
    first: np.ndarray | None = field(default=None, repr=False)
    second: np.ndarray | None = field(default=None, repr=False)

    def step(self, params: np.ndarray, gradient: np.ndarray) -> np.ndarray:
        if self.first is None or self.second is None:
            self.first, self.second = np.zeros_like(params), np.zeros_like(params)
        self.steps += 1
        self.first = self.beta1 * self.first + (1 - self.beta1) * gradient
        self.second = self.beta2 * self.second + (1 - self.beta2) * gradient**2
        first = self.first / (1 - self.beta1**self.steps)
        second = self.second / (1 - self.beta2**self.steps)
        return params + self.learning_rate * first / (np.sqrt(second) + self.epsilon)
