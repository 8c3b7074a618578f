"""A run's reward curve from what the router saw, for a trainer that writes none of its own (a
Nova job's internals are AWS's): every rollout report the proxy accepted (its score and
success flag, lambdas/router/conversations.py), in windows of a training step's rollouts
(`global_batch_size`), one line per window in `runs/<run_id>/metrics.jsonl` — the object
Monitor's stall detection, `mtrl status` and the summary read for every training plane. An
evaluation job of AWS's (Nova's, or a serverless run's) has its episodes from the same reports,
those accepted in its phase (`evaluation_from_reports`).

A window's `step` counts windows, not the trainer's own steps (which only the trainer knows):
with the trainer asking for a step's rollouts at once, the two go together. A failed rollout
(no score) is counted in its window, never scored.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from domain.backends import METRICS_OBJECT, JobStatus, Phase, RunContext, last_step
from domain.episodes import EvaluationStage
from domain.evaluation import deciles, write_episodes
from domain.step_metrics import first_error
from lambdas.router.conversations import ConversationStore, ReportedRollout

SOURCE = "rollout_reports"  # what a line was computed from, beside a trainer's own lines


@dataclass(frozen=True)
class RewardWindow:
    step: int
    rollouts: int  # every report of the window, failed ones included
    rollouts_asked: int  # the same: what run health divides by (domain/health.py)
    failed_rollouts: int
    env_error_rollouts: int  # of the failed, by how their reports say they ended
    timeout_rollouts: int
    truncated_rollouts: int  # with a model turn cut at the token limit (the worker's count)
    mean_reward: float | None
    min_reward: float | None
    reward_p10: float | None
    reward_p50: float | None
    reward_p90: float | None
    max_reward: float | None
    reward_std: float | None  # the population standard deviation of the scores
    turns_per_episode: float | None  # of the reports whose episode says
    pass_rate: float | None  # of the rollouts that said whether they succeeded
    # Of the window's GRPO groups (its reports by record, two scores or more), those whose
    # scores were all the same: no learning signal (run health, domain/health.py).
    zero_variance_groups: float | None
    first_report_at: float
    last_report_at: float
    partial: bool  # fewer rollouts than a step's: the job ended before its window filled
    first_error: str | None = None  # the first failed rollout's error (domain/step_metrics.py)
    source: str = SOURCE


def reward_windows(
    reports: Sequence[ReportedRollout], *, size: int, final: bool = False
) -> list[RewardWindow]:
    """Consecutive windows of `size` reports, in the order they were accepted; the last one,
    short of `size`, only when `final` (the job ended)."""
    if size < 1:
        raise ValueError(f"a window holds at least one rollout, not {size}")
    windows = []
    for start in range(0, len(reports), size):
        chunk = reports[start : start + size]
        if len(chunk) < size and not final:
            break
        windows.append(_window(len(windows) + 1, chunk, partial=len(chunk) < size))
    return windows


def _flat_share(reports: Sequence[ReportedRollout]) -> float | None:
    groups: dict[str, list[float]] = defaultdict(list)
    for report in reports:
        if report.episode is not None and report.score is not None:
            groups[report.episode.record_id].append(report.score)
    scored = [scores for scores in groups.values() if len(scores) >= 2]
    if not scored:
        return None
    return sum(1 for scores in scored if max(scores) == min(scores)) / len(scored)


def _window(step: int, reports: Sequence[ReportedRollout], *, partial: bool) -> RewardWindow:
    scores = [report.score for report in reports if report.score is not None]
    flags = [report.success for report in reports if report.success is not None]
    ended = [report.episode.stop_reason for report in reports if report.episode is not None]
    turns = [report.episode.turns for report in reports if report.episode is not None]
    p10, p50, p90 = deciles(scores)
    return RewardWindow(
        step=step,
        rollouts=len(reports),
        rollouts_asked=len(reports),
        failed_rollouts=len(reports) - len(scores),
        env_error_rollouts=ended.count("env_error"),
        timeout_rollouts=ended.count("timeout"),
        truncated_rollouts=sum(
            1 for r in reports if r.episode is not None and (r.episode.truncated_turns or 0) > 0
        ),
        mean_reward=statistics.fmean(scores) if scores else None,
        min_reward=min(scores, default=None),
        reward_p10=p10,
        reward_p50=p50,
        reward_p90=p90,
        max_reward=max(scores, default=None),
        reward_std=statistics.pstdev(scores) if scores else None,
        turns_per_episode=statistics.fmean(turns) if turns else None,
        pass_rate=sum(flags) / len(flags) if flags else None,
        zero_variance_groups=_flat_share(reports),
        first_report_at=reports[0].reported_at,
        last_report_at=reports[-1].reported_at,
        partial=partial,
        first_error=first_error(r.episode.error for r in reports if r.episode is not None),
    )


class RewardCurve:
    """Keeps a run's `metrics.jsonl` up to date with its rollout reports."""

    def __init__(self, store: ConversationStore, s3: Any) -> None:
        self.store, self.s3 = store, s3

    def update(self, run: RunContext, *, final: bool = False) -> int | None:
        """Write the run's windows when there are more than written; the last step written
        (None before the first window). `final`: the job ended, its last window may be short."""
        key = f"{run.output_prefix}{METRICS_OBJECT}"
        written = last_step(self.s3, bucket=run.bucket, key=key)
        reports = self.store.reports(run.run_id)
        windows = reward_windows(reports, size=run.training.global_batch_size, final=final)
        if not windows or (written is not None and len(windows) <= written):
            return written
        self.s3.put_object(
            Bucket=run.bucket,
            Key=key,
            Body="".join(json.dumps(asdict(window)) + "\n" for window in windows).encode(),
            ContentType="application/x-ndjson",
        )
        return len(windows)


def evaluation_from_reports(
    store: ConversationStore,
    s3: Any,
    run: RunContext,
    stage: EvaluationStage,
    status: JobStatus,
    *,
    invoked: str,
) -> JobStatus:
    """An evaluation job's `status`; once it succeeded, the reports of its rollouts are written
    as its episodes — and none at all fails it (AWS's job played nothing through the run's
    workers: `invoked`, the Lambda its requests come through, was never invoked in its phase)."""
    if status.phase is not Phase.SUCCEEDED:
        return status
    episodes = [report.episode for report in store.reports(run.run_id, stage) if report.episode]
    if not episodes:
        return JobStatus(
            Phase.FAILED,
            f"AWS's {stage} evaluation job succeeded but no rollout of it reached the run's "
            f"reward workers ({invoked} was never invoked in its phase)",
        )
    write_episodes(
        s3, bucket=run.bucket, output_prefix=run.output_prefix, stage=stage, episodes=episodes
    )
    return status
