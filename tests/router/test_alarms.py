"""Per-run queue-age alarms: one per queue, idempotent, removed at teardown."""

from __future__ import annotations

import boto3

from domain.run_queues import QueueKind, queue_name
from lambdas.router.alarms import create_queue_alarms, delete_queue_alarms

TOPIC = "arn:aws:sns:us-east-1:123456789012:nova-mtrl-alerts"


def test_alarms_watch_the_oldest_message_of_each_run_queue(aws) -> None:
    cloudwatch = boto3.client("cloudwatch")
    names = create_queue_alarms(
        cloudwatch, prefix="nova-mtrl", run_id="run-5", topic_arn=TOPIC, max_age_seconds=600
    )
    create_queue_alarms(
        cloudwatch, prefix="nova-mtrl", run_id="run-5", topic_arn=TOPIC, max_age_seconds=600
    )
    alarms = {
        a["AlarmName"]: a
        for a in cloudwatch.describe_alarms(AlarmNamePrefix="nova-mtrl-run-run-5")["MetricAlarms"]
    }
    assert sorted(alarms) == sorted(names) and len(names) == 4
    watched = {alarm["Dimensions"][0]["Value"] for alarm in alarms.values()}
    assert queue_name("nova-mtrl", "run-5", QueueKind.GENERATE_REQUESTS) in watched
    for alarm in alarms.values():
        assert alarm["MetricName"] == "ApproximateAgeOfOldestMessage" and alarm["Threshold"] == 600
        assert alarm["AlarmActions"] == [TOPIC] and alarm["TreatMissingData"] == "notBreaching"


def test_teardown_deletes_only_the_runs_alarms(aws) -> None:
    cloudwatch = boto3.client("cloudwatch")
    create_queue_alarms(cloudwatch, prefix="p", run_id="gone", topic_arn=None)
    create_queue_alarms(cloudwatch, prefix="p", run_id="kept", topic_arn=None)
    delete_queue_alarms(cloudwatch, prefix="p", run_id="gone")
    delete_queue_alarms(cloudwatch, prefix="p", run_id="gone")
    remaining = {
        a["AlarmName"] for a in cloudwatch.describe_alarms(AlarmNamePrefix="p-")["MetricAlarms"]
    }
    assert len(remaining) == 4 and all(name.startswith("p-run-kept-") for name in remaining)
