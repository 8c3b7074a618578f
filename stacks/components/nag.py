"""cdk-nag acknowledgments: one finding at a time, each with the reason a reviewer reads."""

from __future__ import annotations

import json
import weakref
from enum import StrEnum
from typing import Any

from aws_cdk import Acknowledgment, Stack, Validations
from constructs import IConstruct

_ACKNOWLEDGED: weakref.WeakKeyDictionary[IConstruct, set[str]] = weakref.WeakKeyDictionary()


def require_reason(reason: str, what: str) -> None:
    """A reason a reviewer can read: a sentence, not a word (`what`: what it is the reason for)."""
    if len(reason.split()) < 8:
        raise ValueError(f"the reason for {what} must explain itself: {reason!r}")


def acknowledge(construct: IConstruct, finding: str, reason: str) -> None:
    """Acknowledge one cdk-nag finding (e.g. `AwsSolutions-IAM5[Action::s3:List*]`) on `construct`."""
    require_reason(reason, f"acknowledging {finding}")
    pack = finding.split("-", 1)[0]
    # Several grants may widen the same role the same way: one acknowledgment (the first reason).
    done = _ACKNOWLEDGED.setdefault(construct, set())
    if finding in done:
        return
    done.add(finding)
    # Validations keys acknowledgments by plugin: `AwsSolutions::AwsSolutions-IAM5[...]`.
    Validations.of(construct).acknowledge(
        Acknowledgment(id=f"{pack}::{finding}", reason=str(reason))
    )


class Wildcard(StrEnum):
    """Why a granted resource ends in a wildcard: each kind's reason, written once. The finding
    itself names the resource, so the acknowledgment stays scoped to it."""

    NO_RESOURCE_TYPE = (
        "Only actions the Service Authorization Reference gives no resource type are granted on "
        "`*` (tests/test_iam.py checks each; docs/operators/security.md lists them)."
    )
    NAMED_AT_RUN_TIME = (
        "Named at run time, one per run (queues, alarms, services, task families, token "
        "parameters, log groups and streams, executions, aliases, objects): the ARN fixes what "
        "the deployment knows (account, region, prefix, path, function) and leaves only the "
        "run's part open."
    )
    ASSIGNED_BY_AWS = (
        "Ends in an id, version or name the service assigns when it makes the resource (stacks, "
        "access entries, Pod Identity associations, scalable targets, event source mappings, "
        "network interfaces, function versions, model packages, Bedrock models and deployments, "
        "escrow buckets, a service-linked role, a secret's six-character suffix); the rest of "
        "the ARN is named."
    )
    PUBLIC_CATALOG = (
        "AWS's public model catalog (SageMaker's public hub, in account `aws`), described only: "
        "a training config may name any of its models."
    )


CDK_HANDLER = (
    "aws-cdk-lib's own handler (the data bucket's EventBridge notifications, the lifecycle "
    "scripts' upload), run by CloudFormation at deploy time only; aws-cdk-lib makes its role, "
    "runtime and grants: the CDK asset bucket read, the lifecycle bucket written."
)
KEY_GRANT = (
    "Added by aws-cdk-lib's grant on one named key (the statement's only resource): the service "
    "(DynamoDB, SNS) encrypts the caller's items or messages with it."
)


def acknowledge_resource(construct: IConstruct, resource: str, reason: str) -> None:
    """Acknowledge IAM5 for one wildcard resource ARN (tokens allowed) granted to `construct`."""
    rendered = nag_text(Stack.of(construct).resolve(resource))
    acknowledge(construct, f"AwsSolutions-IAM5[Resource::{rendered}]", reason)


def acknowledge_no_resource_type(construct: IConstruct) -> None:
    """`Resource: "*"` on `construct`, for actions that have no resource type."""
    acknowledge_resource(construct, "*", Wildcard.NO_RESOURCE_TYPE)


def acknowledge_managed_policy(construct: IConstruct, policy: str, reason: str) -> None:
    """An AWS managed policy (`policy`, its name) attached to `construct`."""
    acknowledge(
        construct, f"AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/{policy}]",
        reason,
    )  # fmt: skip


def acknowledge_key_grant(
    construct: IConstruct, actions: tuple[str, ...] = ("kms:ReEncrypt*", "kms:GenerateDataKey*")
) -> None:
    """The wildcard KMS actions (`actions`) a key grant of aws-cdk-lib adds to `construct`."""
    for action in actions:
        acknowledge(construct, f"AwsSolutions-IAM5[Action::{action}]", KEY_GRANT)


def nag_text(value: Any) -> str:
    """A resolved CloudFormation value written the way cdk-nag names it in a finding id.

    `{"Ref": "AWS::Region"}` -> `<AWS::Region>`, `{"Fn::GetAtt": [Id, Arn]}` -> `<Id.Arn>`,
    `Fn::Join` concatenated, `Fn::ImportValue` as its export name, `${x}` in strings as `<x>`,
    anything else as compact JSON (so the same code serves environment-specific and
    environment-agnostic stacks).
    """
    if isinstance(value, str):
        return value.replace("${", "<").replace("}", ">")
    if isinstance(value, dict) and len(value) == 1:
        ((function, argument),) = value.items()
        if function == "Ref":
            return f"<{nag_text(argument)}>"
        if function == "Fn::GetAtt":
            return f"<{nag_text(argument[0])}.{nag_text(argument[1])}>"
        if function == "Fn::Join":
            separator, parts = argument
            return separator.join(nag_text(part) for part in parts)
        if function in ("Fn::Sub", "Fn::ImportValue"):
            return nag_text(argument)
    return json.dumps(value, separators=(",", ":"))
