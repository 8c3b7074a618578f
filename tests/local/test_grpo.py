"""The local trainer's GRPO update: advantages, the clipped objective with its KL penalty and
exact gradient, and Adam — each against values worked out by hand from the module's formulas."""

from __future__ import annotations

import math

import numpy as np
import pytest

from domain.grpo import group_advantages
from local_trainer.grpo import Adam, Episode, objective_and_gradient
from local_trainer.policy import Decision

# Two candidates with one feature each, parameters 0: π = (½, ½) and ∇ log π(0) = (1 − ½) = ½.
TWO = np.array([[1.0], [0.0]], dtype=np.float32)
ZERO = np.zeros(1)


def _reply(ratio: float) -> Decision:
    """Candidate 0 of TWO, sampled when its probability was ½ / ratio (so π/π_old = ratio)."""
    return Decision("x", TWO, 0, math.log(0.5) - math.log(ratio))


def _decisions(seed: int, count: int = 4, candidates: int = 7, features: int = 3) -> list[Decision]:
    rng = np.random.default_rng(seed)
    decisions = []
    for _ in range(count):
        matrix = rng.normal(size=(candidates, features)).astype(np.float32)
        decisions.append(
            Decision("x", matrix, int(rng.integers(candidates)), float(-np.log(candidates)))
        )
    return decisions


def test_advantages_are_relative_to_the_group_and_zero_when_flat() -> None:
    advantages = group_advantages([0.0, 1.0, 1.0, 0.0])
    # mean ½, population std ½, plus the epsilon that keeps tiny spreads finite.
    assert np.allclose(advantages, np.array([-0.5, 0.5, 0.5, -0.5]) / (0.5 + 1e-6), rtol=1e-12)
    flat = group_advantages([1, 1, 1])
    assert np.array_equal(flat, np.zeros(3)) and flat.dtype == np.float64


def test_a_spread_of_exactly_epsilon_still_counts_and_a_smaller_one_does_not() -> None:
    assert np.array_equal(group_advantages([0.0, 2.0], epsilon=1.0), [-0.5, 0.5])
    assert not group_advantages([0.0, 2.0], epsilon=1.0 + 1e-9).any()


def test_each_episode_weighs_the_same_however_many_replies_it_has() -> None:
    episodes = [
        Episode([_reply(1.0), _reply(1.1)], 2.0),
        Episode([_reply(0.95)], -1.0),
        Episode([], 5.0),  # an episode with no model reply takes no part
    ]
    objective, gradient, stats = objective_and_gradient(ZERO, episodes, clip_ratio=0.2)
    # ½·mean(1·2, 1.1·2) + ½·(0.95·−1)
    assert objective == pytest.approx(0.5 * 2.1 - 0.5 * 0.95, rel=1e-9)
    # Σ weight·ratio·A·½ with weights ¼, ¼, ½
    expected = 0.25 * 2 * 0.5 + 0.25 * 1.1 * 2 * 0.5 - 0.5 * 0.95 * 0.5
    assert gradient == pytest.approx([expected], rel=1e-9)
    assert (stats.objective, stats.kl, stats.clipped_fraction) == (objective, 0.0, 0.0)


def test_the_clip_bounds_the_objective_only_in_the_advantages_direction() -> None:
    cases = {
        (1.5, 1.0): (1.2, True),  # gained past 1+ε on a good reply: capped
        (0.5, -1.0): (-0.8, True),  # dropped past 1−ε on a bad reply: capped
        (1.5, -1.0): (-1.5, False),  # moved the wrong way: the full penalty, still a gradient
        (0.5, 1.0): (0.5, False),
    }
    for (ratio, advantage), (value, clipped) in cases.items():
        objective, gradient, stats = objective_and_gradient(
            ZERO, [Episode([_reply(ratio)], advantage)], clip_ratio=0.2
        )
        assert objective == pytest.approx(value, rel=1e-9), (ratio, advantage)
        assert stats.clipped_fraction == (1.0 if clipped else 0.0)
        expected = 0.0 if clipped else ratio * advantage * 0.5
        assert gradient == pytest.approx([expected], rel=1e-9), (ratio, advantage)
    mixed = [Episode([_reply(1.5), _reply(1.0), _reply(1.6)], 1.0)]
    assert objective_and_gradient(ZERO, mixed, clip_ratio=0.2)[2].clipped_fraction == 2 / 3


def test_the_kl_penalty_is_the_k3_estimate_against_the_reference() -> None:
    reference = np.array([math.log(3.0)])  # π_ref = (¾, ¼), so log π_ref − log π = log 1.5
    episodes = [Episode([_reply(1.0), _reply(1.0)], 1.0)]  # the KL is the replies' mean
    objective, gradient, stats = objective_and_gradient(
        ZERO, episodes, clip_ratio=0.2, kl_coefficient=0.5, reference=reference
    )
    kl = 1.5 - math.log(1.5) - 1.0
    assert stats.kl == pytest.approx(kl, rel=1e-6)
    assert objective == pytest.approx(1.0 - 0.5 * kl, rel=1e-6)
    # ∇: A·½ − β·(1 − 1.5)·½
    assert gradient == pytest.approx([0.5 + 0.5 * 0.5 * 0.5], rel=1e-6)
    without_kl = ({"kl_coefficient": 0.0, "reference": reference}, {"kl_coefficient": 0.5})
    for without in (*without_kl, {"reference": reference}):  # the coefficient defaults to 0
        objective, gradient, stats = objective_and_gradient(
            ZERO, episodes, clip_ratio=0.2, **without
        )
        assert (objective, stats.kl, gradient.tolist()) == (pytest.approx(1.0), 0.0, [0.5])


def test_no_replies_is_no_update() -> None:
    objective, gradient, stats = objective_and_gradient(ZERO, [Episode([], 1.0)], clip_ratio=0.2)
    assert (objective, gradient.tolist(), stats.clipped_fraction) == (0.0, [0.0], 0.0)


def test_the_gradient_is_the_objectives_derivative() -> None:
    episodes = [Episode(_decisions(1), 1.3), Episode(_decisions(2, count=2), -0.7)]
    params = np.array([0.1, -0.2, 0.05])
    reference = np.array([0.3, 0.0, -0.1])
    kwargs = {"clip_ratio": 10.0, "kl_coefficient": 0.5, "reference": reference}
    _, gradient, _ = objective_and_gradient(params, episodes, **kwargs)
    numeric = np.zeros_like(params)
    for i in range(len(params)):
        step = np.zeros_like(params)
        step[i] = 1e-6
        upper, _, _ = objective_and_gradient(params + step, episodes, **kwargs)
        lower, _, _ = objective_and_gradient(params - step, episodes, **kwargs)
        numeric[i] = (upper - lower) / 2e-6
    assert np.allclose(gradient, numeric, atol=1e-5)


def test_adams_first_two_steps_are_the_textbook_ones() -> None:
    optimizer = Adam(1.0)
    # Step 1, gradient 1: m = 0.1, v = 0.001; bias-corrected both are 1, so the step is 1/(1+ε).
    first = optimizer.step(np.zeros(1), np.ones(1))
    assert first == pytest.approx([1 / (1 + 1e-8)], rel=1e-12)
    # Step 2, gradient −1: m = 0.09 − 0.1 = −0.01 → −0.01/0.19; v = 0.000999 + 0.001 → 1.
    second = optimizer.step(first, -np.ones(1))
    assert second - first == pytest.approx([(-0.01 / 0.19) / (1 + 1e-8)], rel=1e-9)
    assert optimizer.steps == 2 and first.dtype == second.dtype == np.float64


def test_adam_ascends() -> None:
    optimizer = Adam(0.1)
    params = np.zeros(2)
    for _ in range(50):
        params = optimizer.step(params, -2 * (params - np.array([1.0, -1.0])))
    assert np.allclose(params, [1.0, -1.0], atol=0.1)


def test_a_steps_statistics_say_its_first_failed_rollouts_error_cut_to_a_line() -> None:
    """In the order the step asked for them; a rollout that never came back says so; an error
    longer than ERROR_CHARACTERS is cut (the whole is in the trajectories)."""
    from domain.grpo import score_groups
    from domain.protocol import RolloutResponse
    from domain.step_metrics import ERROR_CHARACTERS

    def answered(sample: str, score: float | None, error: str | None = None) -> RolloutResponse:
        if score is None:
            return RolloutResponse(
                sample_id=sample, stop_reason="env_error", rewards={}, error=error
            )
        return RolloutResponse(
            sample_id=sample, stop_reason="end_of_conversation",
            rewards={"aggregate_score": score},
        )  # fmt: skip

    groups = {"a": ["a_0", "a_1", "a_2"], "b": ["b_0", "b_1"]}
    long = "x" * (ERROR_CHARACTERS + 50)
    responses = {
        "a_0": answered("a_0", 1.0), "a_1": answered("a_1", 0.0),
        "a_2": answered("a_2", None, long), "b_1": answered("b_1", None, "second"),
    }  # fmt: skip
    stats = score_groups(groups, responses)[1]
    assert stats.first_error == "x" * (ERROR_CHARACTERS - 1) + "…"
    del responses["a_2"]
    assert score_groups(groups, responses)[1].first_error == "no rollout response in time"
    assert score_groups({"a": ["a_0", "a_1"]}, responses)[1].first_error is None
