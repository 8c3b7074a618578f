"""Per-run FIFO queues: names, attributes, idempotent create and delete."""

from __future__ import annotations

import json

import boto3

from domain.run_queues import (
    MAX_RECEIVE_COUNT,
    QueueKind,
    create_run_queues,
    delete_run_queues,
    queue_name,
)


def test_names_fit_sqs_for_any_run_id() -> None:
    for run_id in ("r1", "2026-11-29T23:59:59Z/bucket/key.jsonl#v3", "x" * 300):
        for kind in QueueKind:
            name = queue_name("nova-mtrl", run_id, kind)
            assert len(name) <= 80 and name.endswith(f"-{kind.suffix}.fifo")
            assert all(c.isalnum() or c in "-_." for c in name)
    dlq = QueueKind.DLQ
    assert queue_name("p", "a" * 300, dlq) != queue_name("p", "a" * 299 + "b", dlq)


def test_create_is_idempotent_and_configures_fifo_dlq_and_encryption(aws) -> None:
    sqs = boto3.client("sqs")
    first = create_run_queues(
        sqs, prefix="nova-mtrl", run_id="run-9", kms_key_id="alias/nova-mtrl-data"
    )
    again = create_run_queues(
        sqs, prefix="nova-mtrl", run_id="run-9", kms_key_id="alias/nova-mtrl-data"
    )
    assert first == again
    assert len(sqs.list_queues(QueueNamePrefix="nova-mtrl-run-run-9")["QueueUrls"]) == 5
    dlq_arn = sqs.get_queue_attributes(QueueUrl=first.dlq, AttributeNames=["QueueArn"])[
        "Attributes"
    ]["QueueArn"]
    for url in (
        first.rollout_requests,
        first.rollout_responses,
        first.generate_requests,
        first.generate_responses,
    ):
        attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        assert (
            attributes["FifoQueue"] == "true" and attributes["ContentBasedDeduplication"] == "false"
        )
        assert attributes["KmsMasterKeyId"] == "alias/nova-mtrl-data"
        assert json.loads(attributes["RedrivePolicy"]) == {
            "deadLetterTargetArn": dlq_arn,
            "maxReceiveCount": MAX_RECEIVE_COUNT,
        }


def test_without_a_key_queues_use_sqs_managed_encryption(aws) -> None:
    sqs = boto3.client("sqs")
    queues = create_run_queues(sqs, prefix="p", run_id="r")
    assert (
        sqs.get_queue_attributes(QueueUrl=queues.generate_requests, AttributeNames=["All"])[
            "Attributes"
        ]["SqsManagedSseEnabled"]
        == "true"
    )


def test_delete_is_idempotent_and_leaves_other_runs_alone(aws) -> None:
    sqs = boto3.client("sqs")
    create_run_queues(sqs, prefix="p", run_id="gone")
    kept = create_run_queues(sqs, prefix="p", run_id="kept")
    assert delete_run_queues(sqs, prefix="p", run_id="gone") == 5
    assert delete_run_queues(sqs, prefix="p", run_id="gone") == 0
    remaining = sqs.list_queues(QueueNamePrefix="p-")["QueueUrls"]
    assert sorted(remaining) == sorted(kept.urls().values())
