"""Held-out evaluation: the records a run never trains on, what one evaluation of a model on
them measures, and how the trained model compares with the one it started from.

A run evaluates its starting model (`baseline`) and its trained model (`final`) on the same
held-out records, with the same environment and reward workers as training: `eval_samples`
rollouts per record. The records are the config's `eval_dataset`, or the share
`eval_fraction` of the training dataset picked by a seeded hash of each record's id — stable
whatever the order of the file, decided line by line, and the trainer skips exactly those.

One evaluation's episodes are kept as they ended (`Episode`, one JSON line each, under
`runs/<run_id>/evaluation/<stage>.jsonl`); everything reported is computed from them here.
"pass" is the environment's success flag (`domain.protocol.SUCCESS_METRIC`): a rollout that
failed (environment error, timeout, no answer) did not pass, and has no reward — it is counted
in the error rates, never scored as 0.
"""

from __future__ import annotations

import hashlib
import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict

from domain.bucket import object_exists
from domain.dataset import DatasetRecord
from domain.episodes import Episode, EvaluationStage
from domain.protocol import sample_id_for
from training_configs.schema import TrainingConfig

# Under a run's outputs: each evaluation's episodes.
EPISODES_PREFIX = "evaluation/"
# Under a run's outputs, for a trainer that reads records from a file (Nova's): the dataset
# without the held-out records, and the records to evaluate on.
TRAINING_RECORDS_OBJECT = "data/training.jsonl"
EVALUATION_RECORDS_OBJECT = "data/evaluation.jsonl"
# Evaluation rollouts' sample ids start with it: never one of a training rollout, even when the
# evaluation file reuses a training record's id.
SAMPLE_PREFIX = "eval-"
CONFIDENCE = 0.95
RESAMPLES = 2000
FAILED_STOPS = ("env_error", "timeout", "no_response")


def episodes_key(output_prefix: str, stage: EvaluationStage) -> str:
    return f"{output_prefix}{EPISODES_PREFIX}{stage}.jsonl"


def results_prefix(outputs: str, stage: EvaluationStage) -> str:
    """Where an evaluation job of AWS's (Nova's, a serverless run's) writes its own results,
    under the run's `outputs` (a key prefix or an S3 URI ending in /)."""
    return f"{outputs}{EPISODES_PREFIX}{stage}/"


def write_episodes(
    s3: Any, *, bucket: str, output_prefix: str, stage: EvaluationStage, episodes: list[Episode]
) -> None:
    """An evaluation's episodes, one JSON line each, where every plane leaves them."""
    s3.put_object(
        Bucket=bucket,
        Key=episodes_key(output_prefix, stage),
        Body="".join(episode.model_dump_json() + "\n" for episode in episodes).encode(),
        ContentType="application/x-ndjson",
    )


def read_episodes(
    s3: Any, *, bucket: str, output_prefix: str, stage: EvaluationStage
) -> list[Episode]:
    """The episodes of the evaluation of `stage` (none when it did not run)."""
    key = episodes_key(output_prefix, stage)
    if not object_exists(s3, bucket=bucket, key=key):
        return []
    body = s3.get_object(Bucket=bucket, Key=key)["Body"].read().decode()
    return [Episode.model_validate_json(line) for line in body.splitlines() if line.strip()]


def held_out(record_id: str, *, fraction: float, seed: int) -> bool:
    """Whether the record is kept for evaluation: its id's seeded hash falls in `fraction`."""
    if fraction <= 0:
        return False
    digest = hashlib.sha256(f"{seed}\0{record_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction


def training_records(
    records: Iterable[DatasetRecord], config: TrainingConfig
) -> list[DatasetRecord]:
    """The records training may draw from: all but the held-out ones."""
    fraction, seed = config.held_out_fraction, config.eval_seed
    return [record for record in records if not held_out(record.id, fraction=fraction, seed=seed)]


def evaluation_source(
    config: TrainingConfig, dataset_key: str, dataset_version: str | None
) -> tuple[str, str | None]:
    """Where a run's evaluation records are read from (key, version): the named evaluation file
    as it is now, or the run's dataset at the version that started it."""
    if config.eval_dataset:
        return config.eval_dataset, None
    return dataset_key, dataset_version


def evaluation_records(
    records: Iterable[DatasetRecord], config: TrainingConfig, *, named_file: bool
) -> list[DatasetRecord]:
    """The first `eval_max_records` records to evaluate on: every record of the evaluation file
    (`named_file`), or the held-out ones of the training dataset."""
    fraction, seed = config.held_out_fraction, config.eval_seed
    chosen = []
    for record in records:
        if len(chosen) == config.eval_max_records:
            break
        if named_file or held_out(record.id, fraction=fraction, seed=seed):
            chosen.append(record)
    return chosen


def evaluation_sample_id(record_id: str, stage: EvaluationStage, number: int, samples: int) -> str:
    """The `number`th evaluation rollout of a record: the baseline's and the final's numbered
    apart, so the router keeps them apart; the same record id in both (the same episode seed)."""
    offset = list(EvaluationStage).index(stage) * samples
    return sample_id_for(f"{SAMPLE_PREFIX}{record_id}", offset + number)


def deciles(scores: Sequence[float]) -> tuple[float | None, float | None, float | None]:
    """The 10th, 50th and 90th percentiles (linear between the scores, as numpy's default)."""
    if not scores:
        return None, None, None
    if len(scores) == 1:
        return scores[0], scores[0], scores[0]
    cuts = statistics.quantiles(scores, n=10, method="inclusive")
    return cuts[0], cuts[4], cuts[8]


def pass_at_k(samples: int, passed: int, k: int) -> float:
    """The chance that at least one of k rollouts drawn from a record's `samples` passes, given
    `passed` of them did (the unbiased estimator of Chen et al. 2021, "Evaluating Large Language
    Models Trained on Code")."""
    if not 0 < k <= samples:
        raise ValueError(f"pass@{k} needs 1 <= k <= {samples} rollouts per record")
    if samples - passed < k:
        return 1.0
    return 1.0 - math.comb(samples - passed, k) / math.comb(samples, k)


class RewardDistribution(BaseModel):
    model_config = ConfigDict(frozen=True)

    min: float
    p10: float
    p50: float
    p90: float
    max: float
    stdev: float


class EvaluationSummary(BaseModel):
    """One evaluation of one model. `n`: its rollouts; rates are shares of them (invalid moves:
    per turn played); pass rates are None when the environment reports no success flag."""

    model_config = ConfigDict(frozen=True)

    stage: EvaluationStage
    n: int
    records: int
    k: int
    scored: int
    mean_reward: float | None
    reward: RewardDistribution | None
    pass_at_1: float | None
    pass_at_k: float | None
    turns_per_episode: float | None
    invalid_move_rate: float | None
    env_error_rate: float
    timeout_rate: float


def _by_record(episodes: Iterable[Episode]) -> dict[str, list[Episode]]:
    grouped: dict[str, list[Episode]] = defaultdict(list)
    for episode in episodes:
        grouped[episode.record_id].append(episode)
    return grouped


def summarize(stage: EvaluationStage, episodes: Sequence[Episode], *, k: int) -> EvaluationSummary:
    """What an evaluation measured; pass@k over the records with at least k rollouts."""
    scores = [episode.score for episode in episodes if episode.score is not None]
    reports_success = any(episode.success is not None for episode in episodes)
    groups = _by_record(episodes).values()
    eligible = [group for group in groups if len(group) >= k]
    played = [episode for episode in episodes if episode.stop_reason not in FAILED_STOPS]
    invalid = [e.invalid_moves for e in played if e.invalid_moves is not None]
    turns = sum(episode.turns for episode in played)
    n = len(episodes)

    def share(*reasons: str) -> float:
        return sum(1 for e in episodes if e.stop_reason in reasons) / n if n else 0.0

    p10, p50, p90 = deciles(scores)
    return EvaluationSummary(
        stage=stage,
        n=n,
        records=len(groups),
        k=k,
        scored=len(scores),
        mean_reward=statistics.fmean(scores) if scores else None,
        reward=RewardDistribution(
            min=min(scores),
            p10=p10,
            p50=p50,
            p90=p90,
            max=max(scores),
            stdev=statistics.pstdev(scores),
        )
        if scores
        else None,  # fmt: skip
        pass_at_1=(sum(e.passed for e in episodes) / n) if reports_success and n else None,
        pass_at_k=(
            statistics.fmean(
                pass_at_k(len(group), sum(e.passed for e in group), k) for group in eligible
            )
            if reports_success and eligible
            else None
        ),
        turns_per_episode=turns / len(played) if played else None,
        invalid_move_rate=sum(invalid) / turns if invalid and turns else None,
        env_error_rate=share("env_error"),
        timeout_rate=share("timeout", "no_response"),
    )


class Delta(BaseModel):
    """final - baseline of one figure, with a paired bootstrap confidence interval (records
    resampled with replacement, both evaluations' episodes of a record kept together)."""

    model_config = ConfigDict(frozen=True)

    baseline: float
    final: float
    delta: float
    ci_low: float
    ci_high: float
    confidence: float = CONFIDENCE


def _pooled(
    baseline: dict[str, list[Episode]],
    final: dict[str, list[Episode]],
    records: list[str],
    value: Callable[[Episode], float | None],
) -> tuple[np.ndarray, np.ndarray]:
    """Per record and evaluation: the sum of `value` over the episodes it counts, and how many."""
    sums, counts = np.zeros((2, len(records))), np.zeros((2, len(records)))
    for row, grouped in enumerate((baseline, final)):
        for column, record in enumerate(records):
            values = [v for v in (value(e) for e in grouped.get(record, [])) if v is not None]
            sums[row, column], counts[row, column] = sum(values), len(values)
    return sums, counts


def _delta(
    sums: np.ndarray, counts: np.ndarray, rng: np.random.Generator, resamples: int
) -> Delta | None:
    if not counts[0].sum() or not counts[1].sum():
        return None
    baseline, final = sums[0].sum() / counts[0].sum(), sums[1].sum() / counts[1].sum()
    picks = rng.integers(0, sums.shape[1], size=(resamples, sums.shape[1]))
    with np.errstate(invalid="ignore", divide="ignore"):
        means = sums[:, picks].sum(axis=2) / counts[:, picks].sum(axis=2)
    differences = means[1] - means[0]
    differences = differences[~np.isnan(differences)]
    tail = (1 - CONFIDENCE) / 2 * 100
    low, high = np.percentile(differences, [tail, 100 - tail])
    return Delta(
        baseline=float(baseline),
        final=float(final),
        delta=float(final - baseline),
        ci_low=float(low),
        ci_high=float(high),
    )


def compare(
    baseline: Sequence[Episode],
    final: Sequence[Episode],
    *,
    seed: int = 0,
    resamples: int = RESAMPLES,
) -> dict[str, Delta]:
    """The change of the mean reward and of pass@1 from baseline to final (a figure is left
    out when either evaluation has nothing to measure it by)."""
    before, after = _by_record(baseline), _by_record(final)
    records = sorted(before.keys() | after.keys())
    rng = np.random.default_rng(seed)
    deltas = {}
    if any(e.success is not None for e in [*baseline, *final]):
        sums, counts = _pooled(before, after, records, lambda e: float(e.passed))
        deltas["pass_at_1"] = _delta(sums, counts, rng, resamples)
    sums, counts = _pooled(before, after, records, lambda e: e.score)
    deltas["mean_reward"] = _delta(sums, counts, rng, resamples)
    return {name: delta for name, delta in deltas.items() if delta is not None}


class EvaluationReport(BaseModel):
    """`runs/<run_id>/evaluation.json`: both evaluations and what changed; `skipped` says why
    an evaluation did not run."""

    model_config = ConfigDict(frozen=True)

    baseline: EvaluationSummary | None = None
    final: EvaluationSummary | None = None
    delta: dict[str, Delta] = {}
    skipped: dict[str, str] = {}

    def headline(self) -> str | None:
        """One line for a notification: `pass@1 0.31 → 0.58 (+0.27, 95% CI +0.12..+0.41)`,
        then how many rollouts of either evaluation failed, when any did."""
        failed = self.failures()
        for name, label in (("pass_at_1", "pass@1"), ("mean_reward", "mean reward")):
            delta = self.delta.get(name)
            if delta is not None:
                n = self.final.n if self.final else 0
                return (
                    f"{label} {delta.baseline:.2f} → {delta.final:.2f} ({delta.delta:+.2f}, "
                    f"{delta.confidence:.0%} CI {delta.ci_low:+.2f}..{delta.ci_high:+.2f}; "
                    f"{n} held-out rollouts)" + (f"; {failed}" if failed else "")
                )
        return None

    def failures(self) -> str | None:
        """How the evaluations' failed rollouts ended, e.g. `baseline: of 32 rollouts, 16 timed
        out` (a model slower than rollout_timeout_seconds); None when none failed."""
        said = []
        for summary in (self.baseline, self.final):
            if summary is None or not summary.n:
                continue
            counts = {
                "timed out": round(summary.timeout_rate * summary.n),
                "ended in an environment error": round(summary.env_error_rate * summary.n),
            }
            ended = [f"{count} {how}" for how, count in counts.items() if count]
            if ended:
                said.append(f"{summary.stage}: of {summary.n} rollouts, {', '.join(ended)}")
        return "; ".join(said) or None
