"""Outside scanners' findings, justified in the templates (stacks/components/scan.py): checkov's
suppression format, a reason for each, and what the platform's functions, log groups and
queues are given instead of a suppression where the fix is cheap. `make scan` runs checkov
itself over cdk.out; these hold the same offline, over every deployment shape."""

from __future__ import annotations

from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk import aws_sqs as sqs

from stacks.components.scan import METADATA_KEY, justify
from tests.conftest import Synthesized

REASON = "A reason long enough to explain itself to a reviewer who reads it"


def skips(resource: dict[str, Any]) -> dict[str, str]:
    return {
        skip["id"]: skip["comment"]
        for skip in resource.get("Metadata", {}).get(METADATA_KEY, {}).get("skip", [])
    }


def test_a_justification_is_checkovs_skip_with_its_reason_once_per_check() -> None:
    stack = cdk.Stack(cdk.App(), "s")
    queue = sqs.Queue(stack, "Q")
    justify(queue, "CKV_AWS_27", REASON)
    justify(queue, "CKV_AWS_27", REASON + ", said again")  # the later reason stands
    justify(queue, "CKV_AWS_28", REASON)
    resource = next(iter(cdk.assertions.Template.from_stack(stack).to_json()["Resources"].values()))
    assert resource["Metadata"][METADATA_KEY] == {
        "skip": [
            {"id": "CKV_AWS_27", "comment": REASON + ", said again"},
            {"id": "CKV_AWS_28", "comment": REASON},
        ]
    }
    with pytest.raises(ValueError, match="must explain itself"):
        justify(queue, "CKV_AWS_27", "because")
    with pytest.raises(TypeError, match="no CloudFormation resource"):
        justify(cdk.Stack(cdk.App(), "t"), "CKV_AWS_27", REASON)


def test_every_function_is_justified_where_a_check_does_not_apply(
    every_app: dict[str, Synthesized],
) -> None:
    """Each Lambda function: reserved concurrency or why not; an environment without secrets,
    explained; outside the VPC only with the reason; a dead-letter queue or who invokes it."""
    for shape, app in every_app.items():
        for stack, template in app.templates.items():
            for name, resource in template["Resources"].items():
                if resource["Type"] != "AWS::Lambda::Function":
                    continue
                where, found = f"{shape}:{stack}:{name}", skips(resource)
                properties = resource["Properties"]
                reserved = "ReservedConcurrentExecutions" in properties
                assert reserved != ("CKV_AWS_115" in found), where
                assert ("Environment" in properties) == ("CKV_AWS_173" in found), where
                assert ("VpcConfig" in properties) != ("CKV_AWS_117" in found), where
                assert ("DeadLetterConfig" in properties) != ("CKV_AWS_116" in found), where
                assert all(len(reason.split()) >= 8 for reason in found.values()), where


def test_every_log_group_is_encrypted_with_the_deployments_key(
    every_app: dict[str, Synthesized],
) -> None:
    for shape, app in every_app.items():
        storage = app.template("storage")
        (key_id,) = [n for n, r in storage["Resources"].items() if r["Type"] == "AWS::KMS::Key"]
        for stack, template in app.templates.items():
            for name, resource in template["Resources"].items():
                if resource["Type"] == "AWS::Logs::LogGroup":
                    key = resource["Properties"].get("KmsKeyId")
                    assert key is not None and key_id in str(key), f"{shape}:{stack}:{name}"


def test_cloudwatch_logs_may_use_the_key_for_this_accounts_log_groups_only(
    default_app: Synthesized,
) -> None:
    """The key policy CloudWatch Logs documents for encrypted log groups, scoped to log groups
    of the deployment's account and region."""
    ((_, key),) = default_app.resources("storage", "AWS::KMS::Key").items()
    (statement,) = [
        s
        for s in key["Properties"]["KeyPolicy"]["Statement"]
        if "logs." in str(s.get("Principal", {}).get("Service", ""))
    ]
    assert statement["Principal"]["Service"] == {
        "Fn::Join": ["", ["logs.", {"Ref": "AWS::Region"}, ".amazonaws.com"]]
    }
    assert set(statement["Action"]) == {
        "kms:Encrypt*", "kms:Decrypt*", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:Describe*"
    }  # fmt: skip
    context = statement["Condition"]["ArnLike"]["kms:EncryptionContext:aws:logs:arn"]
    assert context == {
        "Fn::Join": ["", ["arn:", {"Ref": "AWS::Partition"}, ":logs:", {"Ref": "AWS::Region"},
                          ":", {"Ref": "AWS::AccountId"}, ":log-group:*"]]
    }  # fmt: skip


def test_an_upload_start_run_fails_on_goes_to_the_triggers_dead_letter_queue(
    default_app: Synthesized,
) -> None:
    """StartRun is invoked asynchronously (EventBridge): an event it still fails after Lambda's
    retries is kept, in the queue the upload rule's own failures go to (alarmed)."""
    resources = default_app.template("pipeline")["Resources"]
    (start,) = [r for n, r in resources.items()
                if n.startswith("PipelineStartRun") and r["Type"] == "AWS::Lambda::Function"]  # fmt: skip
    (queue,) = [n for n in resources if n.startswith("PipelineTriggerDeadLetters")
                and resources[n]["Type"] == "AWS::SQS::Queue"]  # fmt: skip
    assert start["Properties"]["DeadLetterConfig"] == {"TargetArn": {"Fn::GetAtt": [queue, "Arn"]}}
    (rule,) = [r for r in resources.values() if r["Type"] == "AWS::Events::Rule"
               and "EventPattern" in r["Properties"]]  # fmt: skip
    (target,) = rule["Properties"]["Targets"]
    assert target["DeadLetterConfig"] == {"Arn": {"Fn::GetAtt": [queue, "Arn"]}}
