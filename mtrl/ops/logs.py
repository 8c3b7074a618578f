"""`mtrl logs`: a run's lines from the CloudWatch log groups of one plane.

- pipeline: the state machine's execution log and every pipeline function's, lines that name
  the run;
- workers: the run's own reward-worker log group (`<prefix>/<run id>`), every line;
- trainer: Container Insights' application log group of the EKS cluster (the
  amazon-cloudwatch-observability add-on ships pod logs there), lines from the run's namespace.

Lines of all groups are merged by time; `follow` polls for new ones (no duplicates).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from domain.naming import StackOutput, run_namespace
from domain.service_logs import pod_log_group
from mtrl.ops.deployment import Deployment

Plane = Literal["pipeline", "workers", "trainer"]


@dataclass(frozen=True)
class LogSource:
    group: str
    pattern: str  # a CloudWatch Logs filter pattern ("" = every line)


@dataclass(frozen=True)
class LogLine:
    timestamp: int  # ms since the epoch
    group: str
    message: str
    event_id: str


def sources(deployment: Deployment, run_id: str, plane: Plane) -> list[LogSource]:
    if plane == "pipeline":
        groups = [g for g in deployment.output(StackOutput.PIPELINE_LOG_GROUPS).split(",") if g]
        return [LogSource(group, f'"{run_id}"') for group in groups]
    if plane == "workers":
        return [
            LogSource(
                f"{deployment.output(StackOutput.REWARD_WORKER_LOG_GROUP_PREFIX)}/{run_id}", ""
            )
        ]
    cluster = deployment.output(StackOutput.EKS_CLUSTER_NAME)
    namespace = run_namespace(deployment.prefix, run_id)
    return [
        LogSource(
            pod_log_group(cluster),
            f'{{ $.kubernetes.namespace_name = "{namespace}" }}',
        )
    ]


def read(logs: Any, wanted: list[LogSource], *, since_ms: int) -> list[LogLine]:
    """Every line since `since_ms` of every source, oldest first (a group not made yet: none)."""
    found = []
    for source in wanted:
        request = {"logGroupName": source.group, "startTime": since_ms}
        if source.pattern:
            request["filterPattern"] = source.pattern
        try:
            for page in logs.get_paginator("filter_log_events").paginate(**request):
                found.extend(
                    LogLine(e["timestamp"], source.group, e["message"].rstrip("\n"), e["eventId"])
                    for e in page["events"]
                )
        except logs.exceptions.ResourceNotFoundException:
            continue
    return sorted(found, key=lambda line: (line.timestamp, line.event_id))


def follow(
    logs: Any,
    wanted: list[LogSource],
    *,
    since_ms: int,
    sleep: Callable[[float], None],
    interval: float = 5.0,
    rounds: int | None = None,
) -> Iterator[LogLine]:
    """Lines as they arrive, each once; `rounds` bounds the polls (None: until interrupted)."""
    seen: set[str] = set()
    polled = 0
    while rounds is None or polled < rounds:
        for line in read(logs, wanted, since_ms=since_ms):
            if line.event_id not in seen:
                seen.add(line.event_id)
                since_ms = max(since_ms, line.timestamp)
                yield line
        polled += 1
        if rounds is None or polled < rounds:
            sleep(interval)
