"""The router's counters as CloudWatch metrics: what each invocation counted leaves the container
in CloudWatch's embedded metric format (Powertools `Metrics`, written to the function's log),
under the namespace `nova-mtrl/router` with the deployment and the function as dimensions."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any, Protocol

from aws_lambda_powertools import Metrics
from aws_lambda_powertools.metrics import MetricUnit

from lambdas.router.settings import metrics_deployment

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


class Counting(Protocol):
    """A router function's logic: it handles an event and counts what happened."""

    @property
    def counters(self) -> Counts: ...

    def handle(self, event: dict[str, Any]) -> dict[str, Any]: ...


def metered_entry(
    function: str, made: Callable[[], Counting], environment: Mapping[str, str]
) -> Callable[[dict[str, Any], Any], dict[str, Any]]:
    """The Lambda entry point of `made()` (composed once): each invocation's counts leave as
    metrics of `function`, whatever the outcome."""
    metrics = router_metrics(function, metrics_deployment(environment))

    @metrics.log_metrics
    def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
        counting = made()
        try:
            return counting.handle(event)
        finally:
            publish(metrics, counting.counters)

    return handler


def router_metrics(function: str, deployment: str) -> Metrics:
    metrics = Metrics(namespace=NAMESPACE, service=function)
    metrics.set_default_dimensions(deployment=deployment)
    return metrics


def publish(metrics: Metrics, counts: Counts) -> None:
    """Add what `counts` counted since the last call (flushed by `metrics.log_metrics`)."""
    for name, value in counts.drain().items():
        if value:
            metrics.add_metric(name=name, unit=MetricUnit.Count, value=value)
