"""A run's training steps as CloudWatch metrics, for the dashboard: Monitor publishes each new
line of `metrics.jsonl` (our trainer's steps or a Nova run's windows) once, as the figures the
dashboard graphs — the mean reward, the success rate and every run-health metric
(domain/health.py: which figures, and each step's) — under `nova-mtrl/Training` with the
deployment and the run as dimensions.

Deployed, they leave in CloudWatch's embedded metric format (Powertools, printed to Monitor's
log: no API call, no permission); local mode keeps them in memory.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from aws_lambda_powertools.metrics import EphemeralMetrics, MetricUnit

from domain.health import TRAINING_METRICS_NAMESPACE, TRAINING_METRICS_SERVICE


class TrainingMetrics(Protocol):
    def publish(self, run_id: str, step: int, figures: Mapping[str, float]) -> None: ...


class EmbeddedMetrics:
    """The deployed publisher: one embedded-metric-format document per step, on stdout."""

    def __init__(self, deployment: str) -> None:
        self.deployment = deployment

    def publish(self, run_id: str, step: int, figures: Mapping[str, float]) -> None:
        if not figures:
            return
        metrics = EphemeralMetrics(
            namespace=TRAINING_METRICS_NAMESPACE, service=TRAINING_METRICS_SERVICE
        )
        metrics.set_default_dimensions(deployment=self.deployment, run_id=run_id)
        for name, figure in figures.items():
            metrics.add_metric(name=name, unit=MetricUnit.NoUnit, value=figure)
        metrics.add_metadata(key="step", value=step)
        metrics.flush_metrics()


class KeptMetrics:
    """Local mode's publisher: what was published, in order (run, step, figures)."""

    def __init__(self) -> None:
        self.published: list[tuple[str, int, dict[str, float]]] = []

    def publish(self, run_id: str, step: int, figures: Mapping[str, float]) -> None:
        self.published.append((run_id, step, dict(figures)))
