"""A run as an experiment-tracking record (MLflow's run: tags, params, metrics by step,
artifacts), built once from what every plane leaves: the config, the metrics lines, the
held-out evaluation, the run-health warnings and how the run ended. The trackers (local mode's
MLflow store, a deployment's managed MLflow server) only send it.

Limits are MLflow's (docs "mlflow.MlflowClient.log_batch", REST API "Log Batch"): at most 1000
metrics, 100 params and 100 tags a request; a param value of at most 6000 characters.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from domain.step_metrics import number
from training_configs.schema import TrainingConfig

EXPERIMENT = "nova-mtrl"  # one experiment per deployment (or per local output folder)
# What MLflow takes in one LogBatch (mlflow/utils/validation.py, MAX_*_PER_BATCH).
MAX_METRICS, MAX_PARAMS, MAX_TAGS, MAX_ENTITIES = 1000, 100, 100, 1000
MAX_PARAM_CHARACTERS = 6000
# What a metrics line says that is not a measure of the step.
NOT_METRICS = frozenset(
    {"step", "started_at", "finished_at", "first_report_at", "last_report_at", "params"}
)
_UNSAFE = re.compile(r"[^A-Za-z0-9_\-. /]")  # MLflow's allowed key characters


@dataclass(frozen=True)
class Metric:
    key: str
    value: float
    step: int
    timestamp_ms: int = 0


@dataclass(frozen=True)
class TrackedRun:
    run_name: str  # the run id
    status: str  # MLflow's: FINISHED, FAILED, KILLED
    tags: dict[str, str]
    params: dict[str, str]
    metrics: list[Metric]
    artifacts: dict[str, bytes] = field(default_factory=dict)  # file name -> content

    def batches(self) -> Iterator[tuple[list[Metric], dict[str, str], dict[str, str]]]:
        """(metrics, params, tags) in pieces MLflow accepts in one request each: at most
        MAX_METRICS metrics, MAX_PARAMS params and MAX_TAGS tags, MAX_ENTITIES in all (MLflow's
        `_validate_batch_log_limits`). Always one, if empty."""
        params, tags, metrics = list(self.params.items()), list(self.tags.items()), self.metrics
        while True:
            batch_params, params = dict(params[:MAX_PARAMS]), params[MAX_PARAMS:]
            batch_tags, tags = dict(tags[:MAX_TAGS]), tags[MAX_TAGS:]
            room = min(MAX_METRICS, MAX_ENTITIES - len(batch_params) - len(batch_tags))
            batch_metrics, metrics = metrics[:room], metrics[room:]
            yield batch_metrics, batch_params, batch_tags
            if not (params or tags or metrics):
                return


def tracked_run(
    *,
    run_id: str,
    succeeded: bool,
    config: TrainingConfig,
    dataset: str,
    metrics: Sequence[Mapping[str, Any]],
    evaluation: Mapping[str, Any] | None = None,
    health: Mapping[str, str] | None = None,
    reason: str | None = None,
    artifacts: Mapping[str, bytes] | None = None,
) -> TrackedRun:
    """The record of a run: the config's fields as params (nested ones by dotted path), each
    metrics line's numbers as `train/<name>` at its step, the evaluations' figures as
    `eval/<stage>/<name>` (the baseline at step 0, the final and the change at the last
    step), run-health warnings and the failure's reason as tags."""
    last = max((line["step"] for line in metrics if isinstance(line.get("step"), int)), default=0)
    points = [
        Metric(f"train/{_key(name)}", float(value), line["step"], _ms(line))
        for line in metrics
        if isinstance(line.get("step"), int)
        for name, value in line.items()
        if name not in NOT_METRICS and number(value) is not None
    ]
    for stage, figures in (evaluation or {}).items():
        if stage == "skipped" or not isinstance(figures, Mapping):
            continue
        for name, value in _numbers(figures):
            points.append(
                Metric(f"eval/{stage}/{_key(name)}", value, 0 if stage == "baseline" else last)
            )
    tags = {
        "run_id": run_id,
        "dataset": dataset,
        "model": config.model,
        "recipe": str(config.recipe),
        "environment": config.environment,
        "config_hash": config.fingerprint,
        **{f"health/{_key(metric)}": _cut(text) for metric, text in (health or {}).items()},
    }
    if reason:
        tags["failure"] = _cut(reason)
    params = {
        _key(name): _cut(value) for name, value in _flat(config.model_dump(mode="json")).items()
    }
    return TrackedRun(
        run_name=run_id,
        status="FINISHED" if succeeded else "FAILED",
        tags=tags,
        params=params,
        metrics=points,
        artifacts=dict(artifacts or {}),
    )


def _flat(data: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    flat: dict[str, str] = {}
    for key, value in data.items():
        if isinstance(value, Mapping) and value:
            flat |= _flat(value, f"{prefix}{key}.")
        else:
            flat[f"{prefix}{key}"] = "" if value is None else str(value)
    return flat


def _numbers(data: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, float]]:
    """Every number in an evaluation summary, by dotted path (e.g. `pass_at_1.delta`)."""
    for key, value in data.items():
        if isinstance(value, Mapping):
            yield from _numbers(value, f"{prefix}{key}.")
        elif (figure := number(value)) is not None:
            yield f"{prefix}{key}", figure


def _key(name: str) -> str:
    return _UNSAFE.sub("_", name)[:250]


def _cut(text: str) -> str:
    return text if len(text) <= MAX_PARAM_CHARACTERS else text[: MAX_PARAM_CHARACTERS - 1] + "…"


def _ms(line: Mapping[str, Any]) -> int:
    ended = number(line.get("finished_at", line.get("last_report_at")))
    return int(ended * 1000) if ended is not None else 0
