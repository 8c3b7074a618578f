"""Per-run queue-health alarms: the age of the oldest message in each of a run's queues.

A rollout or generate queue whose oldest message keeps getting older means one side stopped
consuming (the "stuck training" diagnosis). The pipeline creates these when a run starts and
deletes them at teardown; both are idempotent.
"""

from __future__ import annotations

from typing import Any

from domain.run_queues import KINDS, queue_base, queue_name

DEFAULT_MAX_AGE_SECONDS = 900


def alarm_names(prefix: str, run_id: str) -> list[str]:
    return [f"{queue_base(prefix, run_id)}-{kind.suffix}-oldest-message-age" for kind in KINDS]


def create_queue_alarms(
    cloudwatch: Any,
    *,
    prefix: str,
    run_id: str,
    topic_arn: str | None,
    max_age_seconds: int = DEFAULT_MAX_AGE_SECONDS,
) -> list[str]:
    names = alarm_names(prefix, run_id)
    for name, kind in zip(names, KINDS, strict=True):
        cloudwatch.put_metric_alarm(
            AlarmName=name,
            AlarmDescription=(
                f"Run {run_id}: the oldest message in {kind.suffix} is older than {max_age_seconds} s; "
                "its consumer has stopped (see `mtrl status`)."
            ),
            Namespace="AWS/SQS",
            MetricName="ApproximateAgeOfOldestMessage",
            Dimensions=[{"Name": "QueueName", "Value": queue_name(prefix, run_id, kind)}],
            Statistic="Maximum",
            Period=60,
            EvaluationPeriods=3,
            Threshold=float(max_age_seconds),
            ComparisonOperator="GreaterThanThreshold",
            TreatMissingData="notBreaching",
            AlarmActions=[topic_arn] if topic_arn else [],
            Tags=[{"Key": "nova-mtrl:run", "Value": run_id[:256]}],
        )
    return names


def delete_queue_alarms(cloudwatch: Any, *, prefix: str, run_id: str) -> None:
    cloudwatch.delete_alarms(AlarmNames=alarm_names(prefix, run_id))
