"""Which checkpoint a run releases: the last, unless the held-out evaluation found the start
better — by pass@1 where the environment says what passing is, else by the mean reward."""

from __future__ import annotations

import pytest

from domain.checkpoints import Checkpoint
from domain.evaluation import Delta, EvaluationReport
from lambdas.pipeline.checkpoints import best_checkpoint

LAST = [Checkpoint(name="final", manifest="m", uri="s3://b/final.npz", step=7)]


def _change(delta: float) -> Delta:
    return Delta(
        baseline=0.5, final=0.5 + delta, delta=delta, ci_low=delta - 0.1, ci_high=delta + 0.1
    )


@pytest.mark.parametrize(
    ("deltas", "kept"),
    [
        ({"pass_at_1": 0.2, "mean_reward": -0.1}, True),  # pass@1 decides where there is one
        ({"pass_at_1": -0.2, "mean_reward": 0.1}, False),
        ({"mean_reward": -0.1}, False),  # else the reward
        ({"mean_reward": 0.0}, True),  # as good as the start: kept
    ],
)
def test_the_release_follows_the_held_out_change(deltas: dict, kept: bool) -> None:
    report = EvaluationReport(delta={name: _change(value) for name, value in deltas.items()})
    best = best_checkpoint(LAST, report)
    assert best is not None
    if kept:
        assert best == {
            "name": "final", "uri": "s3://b/final.npz",
            "why": "the last checkpoint, at least as good as the start on the held-out records",
        }  # fmt: skip
    else:
        assert (best["uri"], best["why"]) == (
            None, "the starting model did better on the held-out records",
        )  # fmt: skip


def test_without_a_located_checkpoint_there_is_nothing_to_release() -> None:
    unlocated = [Checkpoint(name="j", manifest="m", uri=None)]
    assert best_checkpoint(unlocated, EvaluationReport()) is None
