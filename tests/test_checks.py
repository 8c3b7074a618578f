"""cfn-lint and cdk-nag over every synthesized template; the suite fails when either regresses."""

from __future__ import annotations

import json

import pytest
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from cfnlint.api import ManualArgs, lint

from stacks.app_builder import build_app
from stacks.components.hyperpod import LIFECYCLE_SCRIPTS_READ
from stacks.components.nag import CDK_HANDLER, Wildcard
from tests.conftest import NO_BUNDLING, Synthesized

# W3005 (DependsOn already implied by a reference) is how CDK writes explicit dependencies.
CFN_LINT_IGNORED = ["W3005"]
REGIONS = ["us-east-1", "us-west-2", "eu-west-1"]


def _lint(template: dict) -> list[str]:
    matches = lint(
        json.dumps(template),
        config=ManualArgs(regions=REGIONS, ignore_checks=CFN_LINT_IGNORED),
    )
    return [f"{match.rule.id} {match.path_string}: {match.message}" for match in matches]


def test_cfn_lint_finds_nothing(every_app: dict[str, Synthesized]) -> None:
    findings = {
        f"{name}/{stack}": problems
        for name, synthesized in every_app.items()
        for stack, template in synthesized.templates.items()
        if (problems := _lint(template))
    }
    assert findings == {}


def test_cfn_lint_would_catch_a_broken_template(default_app: Synthesized) -> None:
    template = json.loads(json.dumps(default_app.template("storage")))
    bucket = next(r for r in template["Resources"].values() if r["Type"] == "AWS::S3::Bucket")
    bucket["Properties"]["VersioningConfiguration"] = {"Status": "Sometimes"}
    assert any(finding.startswith("E3030") for finding in _lint(template))


def test_every_acknowledgment_names_one_finding_and_gives_a_reason(
    every_app: dict[str, Synthesized], nova_app: Synthesized
) -> None:
    for synthesized in [*every_app.values(), nova_app]:
        assert len(synthesized.acknowledgments) >= 100
        for path, finding, reason in synthesized.acknowledgments:
            rule = finding.split("[", 1)[0]
            if rule in {"AwsSolutions-IAM4", "AwsSolutions-IAM5"}:
                assert finding.endswith("]"), f"{path}: {finding} must name what it is about"
            assert len(reason.split()) >= 8, f"{path}: {finding}: {reason!r} explains nothing"


def test_acknowledgments_share_a_few_reasons_a_reviewer_reads_once(
    every_app: dict[str, Synthesized], nova_app: Synthesized
) -> None:
    """Issue #20's bound: a kind of finding (a wildcard named at run time, an id AWS assigns, an
    action without a resource type, a key grant, an AWS managed policy) has one reason, written
    once in stacks/components/nag.py, so a reviewer reads at most 25."""
    reasons = {
        reason
        for synthesized in [*every_app.values(), nova_app]
        for _, _, reason in synthesized.acknowledgments
    }
    assert len(reasons) <= 25, sorted(reasons)
    wildcard_reasons = {
        reason
        for synthesized in [*every_app.values(), nova_app]
        for _, finding, reason in synthesized.acknowledgments
        if finding.startswith("AwsSolutions-IAM5[Resource::")
    }
    # Every wildcard resource is one of the kinds, apart from what aws-cdk-lib's grants add.
    assert wildcard_reasons - {str(kind) for kind in Wildcard} == {
        CDK_HANDLER,
        LIFECYCLE_SCRIPTS_READ,
    }


@pytest.mark.parametrize(
    ("add_violation", "rule"),
    [
        (lambda stack: s3.Bucket(stack, "Unchecked"), "AwsSolutions-S10"),
        (
            lambda stack: iam.Role(
                stack,
                "TooBroad",
                assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
                inline_policies={
                    "all": iam.PolicyDocument(
                        statements=[iam.PolicyStatement(actions=["s3:*"], resources=["*"])]
                    )
                },
            ),
            "AwsSolutions-IAM5",
        ),
    ],
)
def test_cdk_nag_fails_synth_on_an_unacknowledged_finding(
    tmp_path, add_violation, rule: str
) -> None:
    app, config = build_app(NO_BUNDLING, outdir=str(tmp_path))
    stack = app.node.find_child(f"{config.name_prefix}-storage")
    add_violation(stack)
    with pytest.raises(RuntimeError, match="ValidationFailed") as raised:
        app.synth()
    report = json.loads((tmp_path / "validation-report.json").read_text())
    assert rule in str(raised.value) and rule in json.dumps(report)
