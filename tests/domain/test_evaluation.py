"""Held-out evaluation's arithmetic: which records are held out, pass@k, what an evaluation
reports, and the change from baseline to final with its confidence interval."""

from __future__ import annotations

import math

import numpy as np
import pytest

from domain.dataset import DatasetRecord
from domain.episodes import Episode, EvaluationStage
from domain.evaluation import (
    EvaluationReport,
    compare,
    evaluation_records,
    evaluation_sample_id,
    held_out,
    pass_at_k,
    summarize,
    training_records,
)
from domain.protocol import Metric, RolloutResponse, sample_id_for
from training_configs.schema import load_training_config

CONFIG = load_training_config("rft_multiturn_lora")
BASELINE, FINAL = EvaluationStage.BASELINE, EvaluationStage.FINAL


def records(n: int) -> list[DatasetRecord]:
    return [
        DatasetRecord.model_validate({"id": f"game-{i}", "metadata": {"prompt": "Play."}})
        for i in range(n)
    ]


def episode(record: str, number: int, **fields) -> Episode:
    values = {"stop_reason": "end_of_conversation", "turns": 3.0, **fields}
    return Episode(record_id=record, sample_id=f"eval-{record}_{number}", **values)


def test_the_held_out_share_is_seeded_stable_and_about_the_fraction() -> None:
    ids = [f"game-{i}" for i in range(10_000)]
    held = {i for i in ids if held_out(i, fraction=0.1, seed=0)}
    assert 900 < len(held) < 1100
    assert held == {i for i in reversed(ids) if held_out(i, fraction=0.1, seed=0)}
    assert held != {i for i in ids if held_out(i, fraction=0.1, seed=1)}
    assert not any(held_out(i, fraction=0.0, seed=0) for i in ids)


def test_training_never_draws_a_held_out_record_and_evaluation_takes_only_those() -> None:
    dataset = records(500)
    config = CONFIG.model_copy(update={"eval_fraction": 0.2, "eval_max_records": 10_000})
    trained = {r.id for r in training_records(dataset, config)}
    evaluated = {r.id for r in evaluation_records(dataset, config, named_file=False)}
    assert trained.isdisjoint(evaluated) and trained | evaluated == {r.id for r in dataset}
    capped = CONFIG.model_copy(update={"eval_fraction": 0.2, "eval_max_records": 7})
    first = evaluation_records(dataset, capped, named_file=False)
    assert [r.id for r in first] == [r.id for r in dataset if r.id in evaluated][:7]
    # A named evaluation file is evaluated whole (up to the cap); nothing of training is held.
    named = CONFIG.model_copy(update={"eval_dataset": "evaluation-data/e.jsonl"})
    assert len(evaluation_records(records(5), named, named_file=True)) == 5
    assert len(training_records(dataset, named)) == 500


def test_evaluation_sample_ids_never_meet_a_training_or_the_other_stages() -> None:
    ids = {
        evaluation_sample_id("game-1", stage, number, 4)
        for stage in EvaluationStage
        for number in range(4)
    }
    assert len(ids) == 8
    assert not ids & {sample_id_for("game-1", n) for n in range(10_000)}
    assert evaluation_sample_id("game-1", FINAL, 0, 4) == "eval-game-1_4"


@pytest.mark.parametrize(
    ("samples", "passed", "k", "expected"),
    [(4, 1, 1, 0.25), (4, 1, 2, 0.5), (4, 0, 3, 0.0), (4, 2, 3, 1.0), (8, 3, 4, 1 - 5 / 70)],
)
def test_pass_at_k_is_the_unbiased_estimator(samples, passed, k, expected) -> None:
    assert pass_at_k(samples, passed, k) == pytest.approx(expected)


def test_pass_at_k_needs_k_rollouts() -> None:
    with pytest.raises(ValueError, match="1 <= k <= 4"):
        pass_at_k(4, 1, 5)


def test_a_summary_scores_only_finished_rollouts_and_counts_the_failed_ones() -> None:
    found = [
        episode("a", 0, score=1.0, success=True, turns=2.0, invalid_moves=1.0),
        episode("a", 1, score=0.0, success=False, turns=6.0, invalid_moves=0.0),
        episode("b", 0, stop_reason="env_error", error="boom"),
        Episode.unanswered("b", "eval-b_1", 150.0),
    ]
    summary = summarize(BASELINE, found, k=2)
    assert (summary.n, summary.records, summary.scored) == (4, 2, 2)
    assert summary.mean_reward == 0.5 and summary.reward is not None and summary.reward.max == 1.0
    # Failed rollouts did not pass; pass@2 over the records with two rollouts: a (1.0), b (0.0).
    assert summary.pass_at_1 == 0.25 and summary.pass_at_k == 0.5
    assert summary.turns_per_episode == 4.0 and summary.invalid_move_rate == 1 / 8
    assert (summary.env_error_rate, summary.timeout_rate) == (0.25, 0.25)


def test_a_summary_without_success_flags_reports_no_pass_rate() -> None:
    summary = summarize(FINAL, [episode("a", 0, score=0.3)], k=1)
    assert summary.pass_at_1 is None and summary.pass_at_k is None
    assert summarize(FINAL, [], k=4).mean_reward is None


def test_an_episode_is_read_from_its_rollout_response() -> None:
    response = RolloutResponse(
        sample_id="eval-a_0",
        stop_reason="end_of_conversation",
        rewards={"aggregate_score": 0.8},
        metrics=[Metric(name="turns", value=4), Metric(name="env/success", value=1),
                 Metric(name="env/invalid", value=2)],
    )  # fmt: skip
    read = Episode.of("a", response)
    assert (read.score, read.success, read.turns, read.invalid_moves) == (0.8, True, 4.0, 2.0)


def _evaluation(passes: list[int]) -> list[Episode]:
    """Four rollouts per record, `passes[r]` of record r's passing (reward 1, else 0)."""
    return [
        episode(f"r{r}", n, score=float(n < passed), success=n < passed)
        for r, passed in enumerate(passes)
        for n in range(4)
    ]


def test_the_change_has_a_paired_bootstrap_interval_around_it() -> None:
    baseline, final = _evaluation([0, 1, 0, 1, 0, 0] * 5), _evaluation([3, 4, 2, 4, 3, 2] * 5)
    deltas = compare(baseline, final, seed=7)
    change = deltas["pass_at_1"]
    assert change.baseline == pytest.approx(2 / 24) and change.final == pytest.approx(18 / 24)
    assert change.delta == pytest.approx(change.final - change.baseline)
    assert 0 < change.ci_low < change.delta < change.ci_high < 1
    assert compare(baseline, final, seed=7) == deltas  # seeded
    same = compare(baseline, baseline, seed=7)["mean_reward"]
    assert same.delta == 0 and same.ci_low <= 0 <= same.ci_high


def test_a_noisy_small_change_has_an_interval_that_spans_zero() -> None:
    baseline, final = _evaluation([0, 4, 1, 3]), _evaluation([1, 3, 2, 3])
    change = compare(baseline, final, seed=0)["pass_at_1"]
    assert change.ci_low < 0 < change.ci_high and math.isclose(change.delta, 1 / 16)


def test_no_figure_is_compared_without_both_evaluations() -> None:
    assert compare(_evaluation([1, 2]), [], seed=0) == {}
    rewards_only = [episode("a", 0, score=0.2)], [episode("a", 0, score=0.6)]
    assert set(compare(*rewards_only)) == {"mean_reward"}


def test_the_headline_says_before_after_and_how_sure() -> None:
    baseline, final = _evaluation([0, 1] * 10), _evaluation([3, 4] * 10)
    report = EvaluationReport(
        baseline=summarize(BASELINE, baseline, k=4),
        final=summarize(FINAL, final, k=4),
        delta=compare(baseline, final, seed=0),
    )
    headline = report.headline()
    assert headline is not None and headline.startswith("pass@1 0.12 → 0.88 (+0.75, 95% CI +")
    assert headline.endswith("; 80 held-out rollouts)")
    assert EvaluationReport(skipped={"baseline": "no plane"}).headline() is None


def test_an_episode_keeps_its_error_and_counts_no_turn_it_did_not_report() -> None:
    response = RolloutResponse(
        sample_id="eval-a_0", stop_reason="env_error", rewards={"aggregate_score": None},
        metrics=[], error="reset: KeyError: 'answer'",
    )  # fmt: skip
    read = Episode.of("a", response)
    assert (read.error, read.turns, read.score, read.success) == (
        "reset: KeyError: 'answer'", 0.0, None, None,
    )  # fmt: skip


def test_the_reward_distribution_is_numpys_linear_deciles() -> None:
    found = [episode("a", n, score=float(n)) for n in range(11)]
    distribution = summarize(BASELINE, found, k=1).reward
    assert distribution is not None
    assert (distribution.p10, distribution.p50, distribution.p90) == (1.0, 5.0, 9.0)
    assert (distribution.min, distribution.max) == (0.0, 10.0)


def test_rates_count_their_own_stop_reasons_and_nothing_is_a_rate_of_nothing() -> None:
    found = [
        episode("a", 0, score=1.0, turns=4.0),  # no invalid-move metric
        episode("a", 1, stop_reason="timeout", error="late"),
        episode("b", 0, stop_reason="env_error", error="boom"),
        episode("b", 1, score=0.0, turns=2.0),
    ]
    summary = summarize(FINAL, found, k=2)
    assert (summary.timeout_rate, summary.env_error_rate) == (0.25, 0.25)
    assert summary.invalid_move_rate is None and summary.turns_per_episode == 3.0
    empty = summarize(FINAL, [], k=2)
    assert (empty.n, empty.env_error_rate, empty.timeout_rate, empty.pass_at_1) == (
        0,
        0.0,
        0.0,
        None,
    )
    with pytest.raises(ValueError, match="1 <= k"):
        pass_at_k(4, 1, 0)


def test_each_figure_is_pooled_over_its_own_episodes() -> None:
    baseline = [episode("a", 0, score=0.0), episode("a", 1, score=1.0)]
    final = [episode("a", n, score=0.5) for n in range(4)] + [episode("b", 0, score=1.0)]
    change = compare(baseline, final, seed=0)["mean_reward"]
    assert (change.baseline, change.final) == (0.5, 0.6)
    # A record only one evaluation has still counts in that one.
    only_before = [*baseline, episode("c", 0, score=1.0)]
    assert compare(only_before, final, seed=0)["mean_reward"].baseline == pytest.approx(2 / 3)
    # No scored baseline rollout: no change to state.
    failed = [episode("a", 0, stop_reason="env_error", error="x")]
    assert "mean_reward" not in compare(failed, final, seed=0)


def test_the_interval_is_a_95_percent_one() -> None:
    """Many records, each of 4 paired rollouts: the bootstrap's 2.5 and 97.5 percentiles sit
    where the normal approximation puts them, delta ± 1.96 standard errors."""
    rng = np.random.default_rng(3)
    before = rng.random(400).round(2)
    after = np.clip(before + rng.normal(0.1, 0.2, 400), 0, 1).round(2)
    baseline = [episode(f"r{r}", n, score=float(before[r])) for r in range(400) for n in range(4)]
    final = [episode(f"r{r}", n, score=float(after[r])) for r in range(400) for n in range(4)]
    change = compare(baseline, final, seed=1, resamples=20_000)["mean_reward"]
    error = float(np.std(after - before) / np.sqrt(400))
    assert change.ci_low == pytest.approx(change.delta - 1.96 * error, abs=0.08 * error)
    assert change.ci_high == pytest.approx(change.delta + 1.96 * error, abs=0.08 * error)


def test_a_headline_without_pass_rates_says_the_reward() -> None:
    baseline, final = [episode("a", 0, score=0.2)], [episode("a", 0, score=0.6)]
    report = EvaluationReport(final=summarize(FINAL, final, k=1), delta=compare(baseline, final))
    assert report.headline() == (
        "mean reward 0.20 → 0.60 (+0.40, 95% CI +0.40..+0.40; 1 held-out rollouts)"
    )
    no_final = EvaluationReport(delta=compare(baseline, final))
    assert str(no_final.headline()).endswith("; 0 held-out rollouts)")


def test_the_headline_says_how_many_rollouts_of_each_evaluation_failed() -> None:
    """A model slower than rollout_timeout_seconds: half the baseline's rollouts timed out. The
    headline says so, as the timeouts they are, beside the change."""
    baseline = [episode("a", n, score=0.2) for n in range(2)] + [
        episode("a", 2, stop_reason="timeout", score=None),
        episode("a", 3, stop_reason="no_response", score=None),
    ]
    final = [episode("a", n, score=0.6) for n in range(3)] + [
        episode("a", 3, stop_reason="env_error", score=None)
    ]
    report = EvaluationReport(
        baseline=summarize(BASELINE, baseline, k=1),
        final=summarize(FINAL, final, k=1),
        delta=compare(baseline, final),
    )
    assert report.failures() == (
        "baseline: of 4 rollouts, 2 timed out; final: of 4 rollouts, 1 ended in an environment "
        "error"
    )
    assert str(report.headline()).endswith(f"held-out rollouts); {report.failures()}")
    clean = [episode("a", n, score=0.6) for n in range(2)]
    assert EvaluationReport(final=summarize(FINAL, clean, k=1)).failures() is None
