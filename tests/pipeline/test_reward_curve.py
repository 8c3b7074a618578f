"""A run's reward curve from its rollout reports: windows of a step's rollouts, their statistics
against numpy's, and the metrics object kept up to date (in moto's DynamoDB and S3)."""

from __future__ import annotations

import json
from dataclasses import asdict, replace

import boto3
import numpy as np
import pytest

from domain.backends import last_step
from domain.episodes import Episode, EvaluationStage
from domain.health import share
from lambdas.pipeline.reward_curve import RewardCurve, reward_windows
from lambdas.router.conversations import ConversationStore, ReportedRollout, create_table
from tests.pipeline.test_nova_training import RUN as NOVA_RUN

RUN = replace(
    NOVA_RUN,
    config=NOVA_RUN.training.model_copy(update={"global_batch_size": 4}),
)
KEY = f"{RUN.output_prefix}metrics.jsonl"
BASELINE = EvaluationStage.BASELINE


def scored(score: float | None, success: bool | None = None) -> Episode:
    """An episode as a report the proxy accepted ends it."""
    return Episode(record_id="r", sample_id="r_0", stop_reason="end_of_conversation",
                   score=score, success=success)  # fmt: skip


def reported(index: int, score: float | None, success: bool | None = None) -> ReportedRollout:
    return ReportedRollout(
        key=f"report#r{index}", reported_at=100.0 + index, score=score, success=success
    )


def test_windows_hold_a_steps_rollouts_with_their_statistics() -> None:
    scores = [0.1, 0.9, 0.4, 0.7, 0.3, None, 1.0, 0.0, 0.6]
    flags = [True, False, None, True, None, None, True, False, True]
    reports = [reported(i, s, f) for i, (s, f) in enumerate(zip(scores, flags, strict=True))]
    first, second = reward_windows(reports, size=4)
    window = np.array(scores[:4])
    assert first.step == 1 and first.rollouts == 4 and first.failed_rollouts == 0
    assert first.mean_reward == pytest.approx(window.mean())
    assert (first.min_reward, first.max_reward) == (0.1, 0.9)
    assert [first.reward_p10, first.reward_p50, first.reward_p90] == pytest.approx(
        np.percentile(window, [10, 50, 90])
    )
    assert first.pass_rate == pytest.approx(2 / 3)  # of the three that said
    assert (first.first_report_at, first.last_report_at) == (100.0, 103.0)
    assert first.partial is False and first.source == "rollout_reports"
    # A failed rollout is counted in its window and never scored.
    assert second.step == 2 and (second.rollouts, second.failed_rollouts) == (4, 1)
    assert second.mean_reward == pytest.approx(np.mean([0.3, 1.0, 0.0]))
    assert [second.reward_p10, second.reward_p50, second.reward_p90] == pytest.approx(
        np.percentile([0.3, 1.0, 0.0], [10, 50, 90])
    )
    assert second.pass_rate == 0.5
    # The ninth report waits for its window to fill — unless the job ended.
    *_, last = reward_windows(reports, size=4, final=True)
    assert (last.step, last.rollouts, last.partial, last.mean_reward) == (3, 1, True, 0.6)
    assert (last.reward_p10, last.reward_p90, last.pass_rate) == (0.6, 0.6, 1.0)


def test_a_window_without_scores_or_flags_says_none_and_a_window_holds_a_rollout() -> None:
    (window,) = reward_windows([reported(0, None), reported(1, None)], size=2)
    assert (window.failed_rollouts, window.mean_reward, window.reward_p50) == (2, None, None)
    assert (window.min_reward, window.max_reward, window.pass_rate) == (None, None, None)
    assert reward_windows([], size=2, final=True) == []
    assert [w.mean_reward for w in reward_windows([reported(0, 0.2), reported(1, 0.4)], size=1)] == [
        0.2, 0.4,
    ]  # fmt: skip
    with pytest.raises(ValueError, match="^a window holds at least one rollout, not 0$"):
        reward_windows([reported(0, 1.0)], size=0)


@pytest.fixture
def curve(aws: None) -> tuple[RewardCurve, ConversationStore]:
    db, s3 = boto3.client("dynamodb"), boto3.client("s3")
    create_table(db, "conversations")
    s3.create_bucket(Bucket=RUN.bucket)
    s3.put_bucket_versioning(Bucket=RUN.bucket, VersioningConfiguration={"Status": "Enabled"})
    store = ConversationStore(db, "conversations")
    return RewardCurve(store, s3), store


def lines() -> list[dict]:
    body = boto3.client("s3").get_object(Bucket=RUN.bucket, Key=KEY)["Body"].read()
    return [json.loads(line) for line in body.decode().splitlines()]


def test_the_metrics_object_grows_by_a_line_a_filled_window(
    curve: tuple[RewardCurve, ConversationStore],
) -> None:
    reward_curve, store = curve
    assert reward_curve.update(RUN) is None
    assert not boto3.client("s3").list_objects_v2(Bucket=RUN.bucket).get("Contents")
    for index in range(6):
        store.record_report(
            RUN.run_id, f"m{index}", episode=scored(index / 10), stage=None, now=index
        )
    assert (
        store.record_report(RUN.run_id, "m5", episode=scored(0.9, True), stage=None, now=9) is False
    )
    # An evaluation's rollouts (held-out records) are never part of the training curve.
    for index in range(4):
        evaluated = scored(1.0, True)
        store.record_report(RUN.run_id, f"e{index}", episode=evaluated, stage=BASELINE, now=index)
    assert reward_curve.update(RUN) == 1
    (line,) = lines()
    assert (line["step"], line["rollouts"], line["mean_reward"]) == (1, 4, pytest.approx(0.15))
    assert last_step(boto3.client("s3"), bucket=RUN.bucket, key=KEY) == 1
    s3 = boto3.client("s3")
    assert s3.head_object(Bucket=RUN.bucket, Key=KEY)["ContentType"] == "application/x-ndjson"
    # Nothing new: not written again (a second object version would show it).
    assert reward_curve.update(RUN) == 1
    assert len(s3.list_object_versions(Bucket=RUN.bucket, Prefix=KEY)["Versions"]) == 1
    # The job ended: the short window is written too.
    assert reward_curve.update(RUN, final=True) == 2
    assert [(line["step"], line["rollouts"], line["partial"]) for line in lines()] == [
        (1, 4, False), (2, 2, True),
    ]  # fmt: skip


def test_a_curve_is_never_shortened_by_reports_that_expired(
    curve: tuple[RewardCurve, ConversationStore],
) -> None:
    reward_curve, store = curve
    for index in range(8):
        store.record_report(
            RUN.run_id, f"m{index}", episode=scored(0.5, True), stage=None, now=index
        )
    assert reward_curve.update(RUN) == 2
    db = boto3.client("dynamodb")
    for index in range(4):  # the table's TTL took the first window's reports
        db.delete_item(
            TableName="conversations",
            Key={"run_id": {"S": RUN.run_id}, "item": {"S": f"report#m{index}"}},
        )
    assert reward_curve.update(RUN) == 2
    assert len(lines()) == 2
    other = replace(RUN, run_id="another-run", output_prefix="runs/another-run/")
    assert reward_curve.update(other) is None  # its reports only


def test_a_window_counts_how_its_failed_rollouts_ended_for_run_health() -> None:
    def ended(
        index: int, stop_reason: str, score: float | None, truncated: float | None = None
    ) -> ReportedRollout:
        episode = Episode(
            record_id="r", sample_id=f"r_{index}", stop_reason=stop_reason, score=score,
            truncated_turns=truncated, error=f"failure {index}" if score is None else None,
        )  # fmt: skip
        return replace(reported(index, score), episode=episode)

    reports = [ended(0, "env_error", None), ended(1, "timeout", None, 1.0),
               ended(2, "env_error", None), ended(3, "end_of_conversation", 0.5, 2.0),
               reported(4, None)]  # fmt: skip
    (window,) = reward_windows(reports, size=5)
    assert (window.rollouts_asked, window.failed_rollouts) == (5, 4)
    assert (window.env_error_rollouts, window.timeout_rollouts) == (2, 1)
    assert window.truncated_rollouts == 2  # as the workers counted cut turns
    assert window.first_error == "failure 0"  # for the run's summary and its health findings
    assert (window.reward_std, window.turns_per_episode) == (0.0, 0.0)  # one score; no turns said
    line = asdict(window)
    assert share(line, "env_error_rate") == 0.4 and share(line, "failed_rollout_rate") == 0.8
    assert share(line, "truncation_rate") == 0.4


def test_a_window_tells_the_groups_without_a_learning_signal() -> None:
    """Reports grouped by record (a GRPO group): a group whose scores are all alike is flat; a
    group with one score or none says nothing; a window without such groups says None."""

    def of(index: int, record: str, score: float | None) -> ReportedRollout:
        episode = Episode(record_id=record, sample_id=f"{record}_{index}",
                          stop_reason="end_of_conversation" if score is not None else "env_error",
                          score=score)  # fmt: skip
        return replace(reported(index, score), episode=episode)

    reports = [of(0, "a", 0.5), of(1, "a", 0.5), of(2, "b", 0.2), of(3, "b", 0.9),
               of(4, "c", 1.0), of(5, "c", None), of(6, "d", 0.0), of(7, "d", 0.0)]  # fmt: skip
    (window,) = reward_windows(reports, size=8)
    assert window.zero_variance_groups == pytest.approx(2 / 3)  # a and d of a, b, d
    (lonely,) = reward_windows([of(0, "a", 0.5), of(1, "b", 0.5)], size=2)
    assert lonely.zero_variance_groups is None
    assert share(asdict(window), "zero_variance_groups") == pytest.approx(2 / 3)
