"""What starts a run: S3's `Object Created` event for a `.jsonl` under `training-data/` of the
data bucket (EventBridge), delivered to the start function, or kept in a dead-letter queue."""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from domain.bucket import TRAINING_DATA_PREFIX
from stacks.components.nag import acknowledge
from stacks.components.scan import justify


def trigger_dead_letters(scope: Construct) -> sqs.Queue:
    """Where an upload event goes that could not start a run: one EventBridge could not deliver,
    or one the start function still failed after Lambda's retries."""
    dead_letters = sqs.Queue(
        scope,
        "TriggerDeadLetters",
        # SQS-managed: EventBridge cannot use the AWS managed key alias/aws/sqs to deliver
        # dead letters (EventBridge User Guide, "Using dead-letter queues").
        encryption=sqs.QueueEncryption.SQS_MANAGED,
        enforce_ssl=True,
        retention_period=Duration.days(14),
    )
    acknowledge(
        dead_letters,
        "AwsSolutions-SQS3",
        "This queue is itself the dead-letter queue of the upload rule's target.",
    )
    justify(
        dead_letters, "CKV_AWS_27",
        "Encrypted, SQS-managed: EventBridge delivers dead letters only to a queue it needs no "
        "key grant for (EventBridge User Guide, 'Using dead-letter queues'); it holds upload "
        "events (bucket, key, version), no data",
    )  # fmt: skip
    return dead_letters


def upload_trigger(
    scope: Construct, *, data_bucket: s3.IBucket, start: lambda_.IFunction, dead_letters: sqs.IQueue
) -> events.Rule:
    """The upload rule, delivering to `start` (or else to `dead_letters`)."""
    return events.Rule(
        scope,
        "UploadRule",
        description="A .jsonl under training-data/ starts a training run",
        event_pattern=events.EventPattern(
            source=["aws.s3"],
            detail_type=["Object Created"],
            detail={
                "bucket": {"name": [data_bucket.bucket_name]},
                "object": {"key": events.Match.wildcard(f"{TRAINING_DATA_PREFIX}*.jsonl")},
            },
        ),
        targets=[
            targets.LambdaFunction(
                start,
                dead_letter_queue=dead_letters,
                retry_attempts=8,
                max_event_age=Duration.hours(2),
            )
        ],
    )
