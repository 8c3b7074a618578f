"""`grpo.truncated_rollouts: penalise` (domain/grpo.py): a rollout with a turn cut at the token
limit takes its group's lowest reward for its advantage — so it never beats a finished one —
while the step's statistics keep every rollout's own reward; a group whose rewards differ only
by a cut rollout's then has nothing to learn from."""

from __future__ import annotations

import pytest

from domain.episodes import TRUNCATED_METRIC
from domain.grpo import group_advantages, learning_groups, score_groups
from domain.protocol import Metric, RolloutResponse

GROUPS = {"a": ["a_0", "a_1", "a_2"], "b": ["b_0", "b_1"]}


def _answered(sample: str, score: float, *, cut: bool = False) -> RolloutResponse:
    return RolloutResponse(
        sample_id=sample, stop_reason="end_of_conversation", rewards={"aggregate_score": score},
        metrics=[Metric(name=TRUNCATED_METRIC, value=1.0 if cut else 0.0)],
    )  # fmt: skip


RESPONSES = {
    "a_0": _answered("a_0", 1.0, cut=True),  # the best reward, from a cut answer
    "a_1": _answered("a_1", 0.5),
    "a_2": _answered("a_2", 0.0),
    "b_0": _answered("b_0", 1.0, cut=True),
    "b_1": _answered("b_1", 0.0),
}


def _advantages(penalise: bool) -> dict[str, float]:
    scored, _ = score_groups(GROUPS, RESPONSES, penalise_truncated=penalise)
    return {rollout.sample_id: rollout.advantage for rollout in scored}


def test_a_cut_rollout_learns_from_its_groups_lowest_reward() -> None:
    penalised = _advantages(True)
    expected = group_advantages([0.0, 0.5, 0.0])  # a_0 counts as a_2's 0.0
    assert [penalised[s] for s in GROUPS["a"]] == pytest.approx(list(expected))
    assert penalised["a_0"] < 0 < penalised["a_1"]
    assert penalised["b_0"] == penalised["b_1"] == 0.0  # only the cut one differed
    trained = _advantages(False)
    assert trained["a_0"] > 0 and trained["b_0"] > 0


def test_the_statistics_keep_each_rollouts_own_reward() -> None:
    scored, stats = score_groups(GROUPS, RESPONSES, penalise_truncated=True)
    assert {r.sample_id: r.reward for r in scored}["a_0"] == 1.0
    assert stats.mean_reward == pytest.approx(2.5 / 5)
    assert stats.truncated_rollouts == 2
    assert stats.zero_variance_groups == 0.5  # b


def test_dynamic_sampling_counts_the_groups_that_learn_as_the_update_does() -> None:
    assert learning_groups(GROUPS, RESPONSES) == 2
    assert learning_groups(GROUPS, RESPONSES, penalise_truncated=True) == 1
