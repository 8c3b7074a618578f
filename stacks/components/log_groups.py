"""Log groups an AWS service would otherwise create for itself, made first so they have the
deployment's retention and key and are deleted with their stack (domain/service_logs.py names
them)."""

from __future__ import annotations

from aws_cdk import RemovalPolicy
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from constructs import Construct


def service_log_group(
    scope: Construct,
    construct_id: str,
    *,
    name: str,
    key: kms.IKey,
    before: Construct,
    retention: logs.RetentionDays = logs.RetentionDays.THREE_MONTHS,
) -> logs.LogGroup:
    """The group `name`, encrypted with `key`; `before`, the resource that makes the service
    write to it, waits for it (a service that finds no group creates its own, and the stack's
    then fails as a duplicate)."""
    group = logs.LogGroup(
        scope,
        construct_id,
        log_group_name=name,
        retention=retention,
        encryption_key=key,
        removal_policy=RemovalPolicy.DESTROY,
    )
    before.node.add_dependency(group)
    return group
