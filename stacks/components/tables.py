"""The platform's DynamoDB tables, all alike: on demand, under the data key, recoverable to any
point in the last 35 days."""

from __future__ import annotations

from aws_cdk import RemovalPolicy
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_kms as kms
from constructs import Construct


def data_table(
    scope: Construct,
    construct_id: str,
    *,
    data_key: kms.IKey,
    partition_key: str,
    sort_key: str | None = None,
    time_to_live_attribute: str | None = None,
    removal_policy: RemovalPolicy,
) -> dynamodb.Table:
    """A table keyed by strings (`partition_key`, and `sort_key` if given)."""

    def key(name: str) -> dynamodb.Attribute:
        return dynamodb.Attribute(name=name, type=dynamodb.AttributeType.STRING)

    return dynamodb.Table(
        scope,
        construct_id,
        partition_key=key(partition_key),
        sort_key=key(sort_key) if sort_key else None,
        billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
        time_to_live_attribute=time_to_live_attribute,
        encryption=dynamodb.TableEncryption.CUSTOMER_MANAGED,
        encryption_key=data_key,
        point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
            point_in_time_recovery_enabled=True
        ),
        removal_policy=removal_policy,
    )
