"""A step's rollouts scored (domain/grpo.py, both trainers'): which rollouts learn and their
advantages, every figure of the step's statistics worked out by hand, and
`grpo.truncated_rollouts: penalise` — a rollout with a turn cut at the token limit takes its
group's lowest reward for its advantage (so it never beats a finished one), while the
statistics keep every rollout's own reward."""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any

import pytest

from domain.episodes import TRUNCATED_METRIC
from domain.grpo import (
    RolloutStats,
    StepMetrics,
    UpdateStats,
    group_advantages,
    learning_groups,
    score_groups,
    truncated,
)
from domain.protocol import SUCCESS_METRIC, Metric, RolloutResponse


def _answered(
    sample: str,
    score: float,
    *,
    turns: float | None = 1.0,
    cut: bool = False,
    won: bool | None = None,
) -> RolloutResponse:
    metrics = [Metric(name=TRUNCATED_METRIC, value=float(cut))]
    if turns is not None:  # an environment may report no turns
        metrics.append(Metric(name="turns", value=turns))
    if won is not None:
        metrics.append(Metric(name=SUCCESS_METRIC, value=float(won)))
    return RolloutResponse(
        sample_id=sample, stop_reason="end_of_conversation",
        rewards={"aggregate_score": score}, metrics=metrics,
    )  # fmt: skip


def _failed(sample: str, reason: Any, error: str) -> RolloutResponse:
    return RolloutResponse(sample_id=sample, stop_reason=reason, rewards={}, error=error)


# a: three scored; b: its second rollout failed, so the first has no group to learn with; c: two
# scored the same (a flat group), one timed out, one never came back.
STEP = {"a": ["a_0", "a_1", "a_2"], "b": ["b_0", "b_1"], "c": ["c_0", "c_1", "c_2", "c_3"]}
ANSWERS = {
    "a_0": _answered("a_0", 1.0, turns=3, won=True),
    "a_1": _answered("a_1", 0.5, turns=2, won=False),
    "a_2": _answered("a_2", 0.0, turns=4, cut=True),
    "b_0": _answered("b_0", 0.25),
    "b_1": _failed("b_1", "env_error", "boom"),
    "c_0": _answered("c_0", 0.5, won=True, turns=None),
    "c_1": _answered("c_1", 0.5, won=True),
    "c_2": _failed("c_2", "timeout", "slow"),
}


def test_only_groups_with_two_rewards_learn_each_against_its_own() -> None:
    scored, _ = score_groups(STEP, ANSWERS)
    advantages = {r.sample_id: r.advantage for r in scored}
    assert list(advantages) == ["a_0", "a_1", "a_2", "c_0", "c_1"]
    spread = math.sqrt(((0.5**2) * 2) / 3)  # rewards 1, 0.5, 0: mean 0.5
    assert [advantages[s] for s in STEP["a"]] == pytest.approx(
        [0.5 / spread, 0.0, -0.5 / spread], rel=1e-5
    )
    assert advantages["c_0"] == advantages["c_1"] == 0.0
    means = score_groups(STEP, ANSWERS, normalization="mean")[0]
    assert [r.advantage for r in means][:3] == pytest.approx([0.5, 0.0, -0.5])


def test_the_steps_statistics_by_hand() -> None:
    _, stats = score_groups(STEP, ANSWERS)
    assert asdict(stats) == pytest.approx(
        asdict(
            RolloutStats(
                mean_reward=2.5 / 5,  # the learning rollouts' own rewards: 1, .5, 0, .5, .5
                max_reward=1.0,
                reward_std=math.sqrt((0.25 + 0 + 0.25 + 0 + 0) / 5),
                win_rate=3 / 4,  # a_2 reports no success flag
                zero_variance_groups=1 / 3,  # c, of the step's three groups
                turns_per_episode=(3 + 2 + 4 + 0 + 1) / 5,  # c_0 reports no turns
                rollouts=5,
                rollouts_asked=9,
                failed_rollouts=3,  # b_1, c_2, c_3: no reward (b_0 has one, but no group)
                env_error_rollouts=1,
                timeout_rollouts=2,  # c_2, and c_3 that never came back
                truncated_rollouts=1,
                first_error="boom",
            )
        )
    )


def test_a_step_where_nothing_scored_has_no_figures_but_its_counts() -> None:
    groups = {"a": ["a_0", "a_1"]}
    _, stats = score_groups(groups, {"a_0": _failed("a_0", "timeout", "slow")})
    assert (stats.mean_reward, stats.max_reward, stats.reward_std, stats.win_rate) == (None,) * 4
    assert (stats.zero_variance_groups, stats.turns_per_episode) == (None, None)
    assert (stats.rollouts, stats.rollouts_asked, stats.failed_rollouts) == (0, 2, 2)
    assert (stats.timeout_rollouts, stats.env_error_rollouts) == (2, 0)
    assert stats.first_error == "slow"


def test_only_a_turn_cut_at_the_limit_makes_a_rollout_truncated() -> None:
    assert truncated(_answered("x", 1.0, cut=True))
    assert not truncated(_answered("x", 1.0))  # the metric at 0
    assert not truncated(_answered("x", 1.0, turns=2))  # another metric above 0


PENALISED_STEP = {"a": ["a_0", "a_1", "a_2"], "b": ["b_0", "b_1"]}
PENALISED = {
    "a_0": _answered("a_0", 1.0, cut=True),  # the best reward, from a cut answer
    "a_1": _answered("a_1", 0.5),
    "a_2": _answered("a_2", 0.0),
    "b_0": _answered("b_0", 1.0, cut=True),
    "b_1": _answered("b_1", 0.0),
}


def _advantages(**options: Any) -> dict[str, float]:
    scored, _ = score_groups(PENALISED_STEP, PENALISED, **options)
    return {rollout.sample_id: rollout.advantage for rollout in scored}


def test_a_cut_rollout_learns_from_its_groups_lowest_reward() -> None:
    penalised = _advantages(penalise_truncated=True)
    expected = group_advantages([0.0, 0.5, 0.0])  # a_0 counts as a_2's 0.0
    assert [penalised[s] for s in PENALISED_STEP["a"]] == pytest.approx(list(expected))
    assert penalised["a_0"] < 0 < penalised["a_1"]
    assert penalised["b_0"] == penalised["b_1"] == 0.0  # only the cut one differed
    trained = _advantages()  # by default a cut rollout's reward is its own
    assert trained["a_0"] > 0 and trained["b_0"] > 0


def test_penalised_the_statistics_keep_each_rollouts_own_reward() -> None:
    scored, stats = score_groups(PENALISED_STEP, PENALISED, penalise_truncated=True)
    assert {r.sample_id: r.reward for r in scored}["a_0"] == 1.0
    assert stats.mean_reward == pytest.approx(2.5 / 5)
    assert stats.truncated_rollouts == 2
    assert stats.zero_variance_groups == 0.5  # b


def test_dynamic_sampling_counts_the_groups_that_learn_as_the_update_does() -> None:
    assert learning_groups(PENALISED_STEP, PENALISED) == 2
    assert learning_groups(PENALISED_STEP, PENALISED, penalise_truncated=True) == 1
    # A group needs two rewards; one whose only rollouts failed counts for nothing, penalised too.
    lonely = {"a": ["a_0", "a_1"], "b": ["b_0", "b_1", "b_2"]}
    answers = {"a_0": PENALISED["a_0"], "b_0": PENALISED["b_0"], "b_1": PENALISED["b_1"]}
    for penalise in (False, True):
        assert learning_groups(lonely, answers, penalise_truncated=penalise) == int(not penalise)


def test_a_steps_line_holds_the_update_or_its_keys_empty() -> None:
    _, stats = score_groups(PENALISED_STEP, PENALISED)
    update = UpdateStats(objective=0.5, kl=0.1, clipped_fraction=0.25)
    line = StepMetrics(3, stats, update, 12.5, 100.0, 112.5, {"sequences": 4}).line()
    assert (line["step"], line["seconds"], line["started_at"], line["finished_at"]) == (
        3, 12.5, 100.0, 112.5,
    )  # fmt: skip
    assert (line["objective"], line["kl"], line["sequences"]) == (0.5, 0.1, 4)
    assert line["mean_reward"] == stats.mean_reward
    idle = StepMetrics(3, stats, None, 12.5, 100.0, 112.5).line()
    assert idle["objective"] is None and idle["grad_norm"] is None
    assert idle.keys() == line.keys() - {"sequences"}
