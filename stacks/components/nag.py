"""cdk-nag acknowledgments: one finding at a time, each with the reason a reviewer reads."""

from __future__ import annotations

import json
import weakref
from typing import Any

from aws_cdk import Acknowledgment, Stack, Validations
from constructs import IConstruct

_ACKNOWLEDGED: weakref.WeakKeyDictionary[IConstruct, set[str]] = weakref.WeakKeyDictionary()


def acknowledge(construct: IConstruct, finding: str, reason: str) -> None:
    """Acknowledge one cdk-nag finding (e.g. `AwsSolutions-IAM5[Action::s3:List*]`) on `construct`."""
    if len(reason.split()) < 8:
        raise ValueError(f"the reason for acknowledging {finding} must explain itself: {reason!r}")
    pack = finding.split("-", 1)[0]
    # Several grants may widen the same role the same way: one acknowledgment (the first reason).
    done = _ACKNOWLEDGED.setdefault(construct, set())
    if finding in done:
        return
    done.add(finding)
    # Validations keys acknowledgments by plugin: `AwsSolutions::AwsSolutions-IAM5[...]`.
    Validations.of(construct).acknowledge(Acknowledgment(id=f"{pack}::{finding}", reason=reason))


def acknowledge_key_grant(construct: IConstruct, what: str) -> None:
    """The wildcard actions a KMS key's `grant_encrypt_decrypt` adds, for the data it protects."""
    for action in ("kms:ReEncrypt*", "kms:GenerateDataKey*"):
        acknowledge(
            construct,
            f"AwsSolutions-IAM5[Action::{action}]",
            f"From the data key's grant only, which encrypts {what}.",
        )


def acknowledge_resource(construct: IConstruct, rule: str, resource: str, reason: str) -> None:
    """Acknowledge `rule` for one wildcard resource ARN (tokens allowed) granted to `construct`."""
    rendered = nag_text(Stack.of(construct).resolve(resource))
    acknowledge(construct, f"{rule}[Resource::{rendered}]", reason)


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
