"""The docs (operators/deploy.md) show the operator's policy exactly as the pipeline stack makes it (the managed
policy `<prefix>-operator`, declared as the "operator" entry of stacks/components/access.py and
checked by the IAM proof against every `mtrl` command). `UPDATE_README=1` rewrites it."""

from __future__ import annotations

import json

from stacks.components.nag import nag_text
from tests.conftest import Synthesized
from tests.iam.policy import as_list
from tests.readme import check_section


def rendered(app: Synthesized) -> str:
    """The policy document, references written as cdk-nag writes them (`<Logical.Arn>`)."""
    ((_, policy),) = [
        (logical_id, resource)
        for logical_id, resource in app.template("pipeline")["Resources"].items()
        if resource["Type"] == "AWS::IAM::ManagedPolicy" and logical_id.startswith("OperatorPolicy")
    ]
    statements = [
        {
            "Effect": statement["Effect"],
            "Action": sorted(as_list(statement["Action"])),
            "Resource": sorted(nag_text(r) for r in as_list(statement["Resource"])),
            **({"Condition": statement["Condition"]} if "Condition" in statement else {}),
        }
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]
    ]
    statements.sort(key=lambda s: (s["Action"], s["Resource"]))
    document = json.dumps({"Version": "2012-10-17", "Statement": statements}, indent=2)
    return f"```json\n{document}\n```"


def test_the_readme_shows_the_operator_policy_the_stack_makes(default_app: Synthesized) -> None:
    check_section("operator-policy", rendered(default_app))
