"""The router's counters as CloudWatch metrics: what each invocation counted leaves the container
in CloudWatch's embedded metric format (Powertools `Metrics`, written to the function's log),
under the namespace `nova-mtrl/router` with the deployment and the function as dimensions."""

from __future__ import annotations

from dataclasses import dataclass, fields

from aws_lambda_powertools import Metrics
from aws_lambda_powertools.metrics import MetricUnit

NAMESPACE = "nova-mtrl/router"
PROBLEMS_KEPT = 50  # a warm container keeps the latest problems only (each is also logged)


@dataclass
class Counts:
    """Counters of one function; `drain()` hands over and resets what was counted."""

    def drain(self) -> dict[str, int]:
        counted = {}
        for counter in fields(self):
            value = getattr(self, counter.name)
            if isinstance(value, int):
                counted[counter.name] = value
                setattr(self, counter.name, 0)
        return counted


def router_metrics(function: str, deployment: str) -> Metrics:
    metrics = Metrics(namespace=NAMESPACE, service=function)
    metrics.set_default_dimensions(deployment=deployment)
    return metrics


def publish(metrics: Metrics, counts: Counts) -> None:
    """Add what `counts` counted since the last call (flushed by `metrics.log_metrics`)."""
    for name, value in counts.drain().items():
        if value:
            metrics.add_metric(name=name, unit=MetricUnit.Count, value=value)
