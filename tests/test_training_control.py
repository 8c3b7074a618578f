"""The pipeline's rights and settings for the training plane on HyperPod (training_control.py):
EKS access through a Kubernetes group (RBAC applied at deploy time), SageMaker capacity calls
on the cluster's own ARN, and the keep-warm schedule."""

from __future__ import annotations

import json
import re
from typing import Any

import boto3
import botocore.session

from domain.kubernetes_rbac import nova_launcher_rbac, pipeline_rbac, rbac_of, rbac_properties
from domain.naming import RUN_SERVICE_ACCOUNT, run_namespace
from domain.nova_job import FORGE_EVALUATION_RECIPE, FORGE_RECIPE_SOURCE, FORGE_RECIPES
from domain.tables import LEASE_KEY
from lambdas.pipeline.hyperpod_training import HyperPodSettings
from tests.aws import create_leases_table, create_runs_table
from tests.conftest import (
    HUB_TOKEN_SECRET,
    Synthesized,
    arn_text,
    as_list,
    handler_of,
    policy_statements,
    role_statements,
)

KUBERNETES_STEPS = ("SubmitJob", "Monitor", "ReleaseCompute")
CAPACITY_STEPS = ("ScaleUp", "NodesReady", "ReleaseCompute")
CLUSTER_ADMIN = "cluster-access-policy/AmazonEKSClusterAdminPolicy"


def _function(template: dict, prefix: str) -> tuple[str, dict]:
    (found,) = [
        (logical_id, r) for logical_id, r in template["Resources"].items()
        if r["Type"] == "AWS::Lambda::Function" and logical_id.startswith(prefix)
    ]  # fmt: skip
    return found


def _role_id(function: dict) -> str:
    return function["Properties"]["Role"]["Fn::GetAtt"][0]


def _entries(template: dict) -> dict[str, dict]:
    """Access entries by the logical id of the role they name."""
    return {
        r["Properties"]["PrincipalArn"]["Fn::GetAtt"][0]: r["Properties"]
        for r in template["Resources"].values()
        if r["Type"] == "AWS::EKS::AccessEntry"
        and isinstance(r["Properties"]["PrincipalArn"], dict)
    }


def test_job_steps_reach_kubernetes_only_through_the_pipeline_group(
    default_app: Synthesized,
) -> None:
    template = default_app.template("pipeline")
    entries = _entries(template)
    for step in KUBERNETES_STEPS:
        _, function = _function(template, f"Pipeline{step}Function")
        entry = entries[_role_id(function)]
        assert entry["ClusterName"] == "nova-mtrl-eks"
        assert entry["KubernetesGroups"] == ["nova-mtrl:pipeline"]
        assert "AccessPolicies" not in entry  # no EKS access policy: RBAC says what it may do
        (describe,) = [
            s for s in role_statements(template, _role_id(function))
            if "eks:DescribeCluster" in as_list(s["Action"])
        ]  # fmt: skip
        assert "cluster/nova-mtrl-eks" in json.dumps(describe["Resource"])


def test_only_the_deploy_time_rbac_function_is_cluster_admin(default_app: Synthesized) -> None:
    template = default_app.template("pipeline")
    admins = [
        role for role, entry in _entries(template).items()
        if CLUSTER_ADMIN in json.dumps(entry.get("AccessPolicies", []))
    ]  # fmt: skip
    bootstrap_id, bootstrap = _function(template, "TrainingClusterControlRbacBootstrap")
    assert admins == [_role_id(bootstrap)]
    assert bootstrap["Properties"]["Handler"] == "lambdas.kubernetes.bootstrap.on_event"
    ((logical_id, rbac),) = [
        (i, r) for i, r in template["Resources"].items() if r["Type"] == "Custom::KubernetesRbac"
    ]
    assert rbac["Properties"]["ServiceToken"] == {"Fn::GetAtt": [bootstrap_id, "Arn"]}
    # The default deployment is Nova-ready: the launcher's Role in kubeflow beside the pipeline's.
    # The function builds the objects; the template names the set and its digest, never objects.
    properties = {k: v for k, v in rbac["Properties"].items() if k != "ServiceToken"}
    assert properties == rbac_properties("nova-mtrl", nova_launcher=True)
    assert rbac_of("nova-mtrl", properties) == pipeline_rbac("nova-mtrl") + nova_launcher_rbac(
        "nova-mtrl"
    )
    # Applied only once the function may talk to the cluster.
    entry_ids = [
        i for i, r in template["Resources"].items() if r["Type"] == "AWS::EKS::AccessEntry"
    ]
    assert set(as_list(rbac["DependsOn"])) & set(entry_ids)


def _invoke_grants(template: dict) -> list[tuple[str, Any]]:
    """(logical id, what it lets be invoked) of every invoke grant in a template: statements of
    roles' and managed policies that allow a Lambda invoke, and functions' resource policies."""
    grants: list[tuple[str, Any]] = []
    for logical_id, resource in template["Resources"].items():
        properties = resource.get("Properties", {})
        if resource["Type"] == "AWS::Lambda::Permission":
            grants.append((logical_id, properties["FunctionName"]))
        documents = [properties["PolicyDocument"]] if "PolicyDocument" in properties else []
        documents += [policy["PolicyDocument"] for policy in properties.get("Policies", [])]
        for statement in (s for document in documents for s in document["Statement"]):
            actions = as_list(statement.get("Action", []))
            if any(a in ("*", "lambda:*") or a.startswith("lambda:Invoke") for a in actions):
                grants.append((logical_id, statement.get("Resource")))
    return grants


def test_nothing_in_the_app_may_invoke_the_cluster_admin_custom_resources(
    default_app: Synthesized,
) -> None:
    """The RBAC bootstrap and the chart installer are cluster admin: only CloudFormation calls
    them, as the deploying principal. No role, managed policy or resource policy of the app lets
    anyone else invoke them, and no invoke grant is a pattern that could match them."""
    admins = {
        logical_id
        for template in default_app.templates.values()
        for logical_id, r in template["Resources"].items()
        if r["Type"] == "AWS::Lambda::Function"
        and r["Properties"].get("Handler", "").startswith("lambdas.kubernetes.")
        and r["Properties"]["Handler"].endswith(".on_event")
    }
    assert len(admins) == 2  # the RBAC bootstrap and the HyperPod chart's installer
    grants = [g for t in default_app.templates.values() for g in _invoke_grants(t)]
    assert len(grants) > 5  # the pipeline's own invokes are found
    for logical_id, target in grants:
        assert not admins & set(re.findall(r'"([A-Za-z0-9]+)"', json.dumps(target))), logical_id
        assert all(isinstance(t, dict) for t in as_list(target)), (logical_id, target)


def test_capacity_steps_act_on_the_hyperpod_cluster_and_pass_its_role_to_sagemaker(
    default_app: Synthesized,
) -> None:
    template = default_app.template("pipeline")
    for step in ("ScaleUp", "ReleaseCompute"):
        _, function = _function(template, f"Pipeline{step}Function")
        statements = role_statements(template, _role_id(function))
        (capacity,) = [s for s in statements if "sagemaker:UpdateCluster" in as_list(s["Action"])]
        assert sorted(as_list(capacity["Action"])) == [
            "sagemaker:BatchAddClusterNodes", "sagemaker:BatchDeleteClusterNodes",
            "sagemaker:DescribeCluster", "sagemaker:UpdateCluster",
        ]  # fmt: skip
        assert "Fn::ImportValue" in json.dumps(capacity["Resource"])  # the cluster's real ARN
        (passes,) = [
            s for s in statements
            if "iam:PassRole" in as_list(s["Action"]) and "sagemaker" in json.dumps(s["Condition"])
        ]  # fmt: skip
        assert "Fn::ImportValue" in json.dumps(passes["Resource"])  # the cluster's execution role
    # Counting nodes is all NodesReady does with SageMaker: it cannot change the cluster.
    _, nodes_ready = _function(template, "PipelineNodesReadyFunction")
    actions = {
        a for s in role_statements(template, _role_id(nodes_ready)) for a in as_list(s["Action"])
    }
    assert "sagemaker:ListClusterNodes" in actions
    assert not {"sagemaker:UpdateCluster", "iam:PassRole"} & actions


def test_job_steps_have_every_setting_the_backend_reads(default_app: Synthesized) -> None:
    template = default_app.template("pipeline")
    for step in ("ScaleUp", "NodesReady", "SubmitJob", "Monitor", "ReleaseCompute"):
        _, function = _function(template, f"Pipeline{step}Function")
        variables = function["Properties"]["Environment"]["Variables"]
        for field in HyperPodSettings.model_fields.values():
            if field.is_required() and field.alias != "AWS_REGION":  # Lambda sets AWS_REGION
                assert field.alias in variables, (step, field.alias)
        assert variables["HYPERPOD_INSTANCE_GROUP"] == "gpu"
        presets = json.loads(_joined(variables["MODEL_PRESETS"]))
        assert set(presets) == {"qwen3-8b"}
        # The preset names no image: the one `cdk deploy` builds from llm_trainer/Dockerfile.
        assert presets["qwen3-8b"]["trainer_image"] == "<image>"
        (image,) = [
            part for part in variables["MODEL_PRESETS"]["Fn::Join"][1] if isinstance(part, dict)
        ]
        assert "container-assets" in image["Fn::Sub"] and image["Fn::Sub"].startswith(
            "${AWS::AccountId}.dkr.ecr.${AWS::Region}."
        )
    _, register = _function(template, "PipelineRegisterFunction")
    assert "MODEL_PRESETS" in register["Properties"]["Environment"]["Variables"]


def _joined(value: Any) -> str:
    """A string the template builds with Fn::Join, its references as `<image>`."""
    if isinstance(value, str):
        return value
    return "".join(part if isinstance(part, str) else "<image>" for part in value["Fn::Join"][1])


def _tables(template: dict) -> dict[str, dict]:
    return {i: r for i, r in template["Resources"].items() if r["Type"] == "AWS::DynamoDB::Table"}


def test_capacity_leases_have_a_table_of_their_own_that_only_capacity_steps_write(
    default_app: Synthesized, aws: None
) -> None:
    """Runs and leases apart: the leases table, keyed by instance group, is written only by the
    steps that scale nodes, and no function updates items of the runs table."""
    template = default_app.template("pipeline")
    tables = _tables(template)
    (leases_id,) = [i for i in tables if i.startswith("TrainingClusterControlCapacityLeases")]
    (runs_id,) = [i for i in tables if i.startswith("PipelineRuns")]
    assert tables[leases_id]["Properties"]["KeySchema"] == [
        {"AttributeName": LEASE_KEY, "KeyType": "HASH"}
    ]
    assert tables[leases_id]["Properties"]["SSESpecification"]["SSEEnabled"] is True
    # The tables the tests make are the tables the stack declares.
    db = boto3.client("dynamodb")
    create_leases_table(db, "leases")
    create_runs_table(db, "runs")
    for made, declared in (("leases", leases_id), ("runs", runs_id)):
        declared_keys = tables[declared]["Properties"]["KeySchema"]
        assert db.describe_table(TableName=made)["Table"]["KeySchema"] == declared_keys
    writers = set()
    for logical_id, function in template["Resources"].items():
        if function["Type"] != "AWS::Lambda::Function":
            continue
        for statement in role_statements(template, _role_id(function)):
            resources, actions = as_list(statement["Resource"]), as_list(statement["Action"])
            if {"Fn::GetAtt": [leases_id, "Arn"]} in resources and "dynamodb:UpdateItem" in actions:
                writers.add(handler_of(function).rsplit(".", 1)[-1])
            if {"Fn::GetAtt": [runs_id, "Arn"]} in resources:
                assert "dynamodb:UpdateItem" not in actions, logical_id
        variables = function["Properties"].get("Environment", {}).get("Variables", {})
        if "CAPACITY_LEASES_TABLE" in variables:
            assert variables["CAPACITY_LEASES_TABLE"] == {"Ref": leases_id}
    assert writers == {"scale_up", "release_compute", "reap"}


def test_no_idle_release_without_keep_warm(default_app: Synthesized) -> None:
    template = default_app.template("pipeline")
    assert not any(i.startswith("PipelineReleaseIdle") for i in template["Resources"])


def test_keep_warm_adds_a_scheduled_idle_release(pinned_app: Synthesized) -> None:
    template = pinned_app.template("pipeline")
    function_id, function = _function(template, "PipelineReleaseIdleFunction")
    assert handler_of(function) == "lambdas.pipeline.handlers.release_idle"
    assert function["Properties"]["Environment"]["Variables"]["KEEP_WARM_SECONDS"] == "1800"
    (rule,) = [
        r for r in template["Resources"].values()
        if r["Type"] == "AWS::Events::Rule"
        and any(t["Arn"] == {"Fn::GetAtt": [function_id, "Arn"]} for t in r["Properties"].get("Targets", []))
    ]  # fmt: skip
    assert rule["Properties"]["ScheduleExpression"] == "rate(5 minutes)"
    statements = role_statements(template, _role_id(function))
    assert any("sagemaker:UpdateCluster" in as_list(s["Action"]) for s in statements)


def test_an_existing_hyperpod_cluster_is_matched_in_the_account(
    existing_hyperpod_app: Synthesized,
) -> None:
    template = existing_hyperpod_app.template("pipeline")
    _, function = _function(template, "PipelineScaleUpFunction")
    statements = role_statements(template, _role_id(function))
    (capacity,) = [s for s in statements if "sagemaker:UpdateCluster" in as_list(s["Action"])]
    assert ":cluster/*" in json.dumps(capacity["Resource"])
    # No execution role configured for the existing cluster: nothing to pass.
    assert not any("iam:PassRole" in as_list(s["Action"]) for s in statements)


def test_run_pods_get_the_job_role_through_pod_identity_only(default_app: Synthesized) -> None:
    template = default_app.template("pipeline")
    ((role_id, role),) = [
        (i, r) for i, r in template["Resources"].items()
        if r["Type"] == "AWS::IAM::Role" and i.startswith("TrainingClusterControlJobRole")
    ]  # fmt: skip
    (trust,) = role["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert trust["Principal"] == {"Service": "pods.eks.amazonaws.com"}
    assert sorted(as_list(trust["Action"])) == ["sts:AssumeRole", "sts:TagSession"]
    # Only a run's service account, in a run namespace of this deployment's cluster: the session
    # tags Pod Identity sets (EKS User Guide, "Create IAM role with trust policy required by EKS
    # Pod Identity"). Another association of the account cannot assume it.
    assert trust["Condition"] == {
        "StringEquals": {
            "aws:RequestTag/eks-cluster-name": "nova-mtrl-eks",
            "aws:RequestTag/kubernetes-service-account": RUN_SERVICE_ACCOUNT,
        },
        "StringLike": {"aws:RequestTag/kubernetes-namespace": "nova-mtrl-run-*"},
    }
    assert run_namespace("nova-mtrl", "wordle-0a1b2c3d4e").startswith("nova-mtrl-run-")
    statements = role_statements(template, role_id)
    (queues,) = [s for s in statements if "sqs:ReceiveMessage" in as_list(s["Action"])]
    assert "nova-mtrl-run-*" in json.dumps(queues["Resource"])
    (writes,) = [s for s in statements if "s3:PutObject" in as_list(s["Action"])]
    assert json.dumps(writes["Resource"]).endswith('/runs/*"]]}')
    for step in ("SubmitJob", "ReleaseCompute"):
        _, function = _function(template, f"Pipeline{step}Function")
        assert function["Properties"]["Environment"]["Variables"]["TRAINING_JOB_ROLE_ARN"] == {
            "Fn::GetAtt": [role_id, "Arn"]
        }
    # SubmitJob makes the association (passing the job role to pods.eks); ReleaseCompute removes
    # it and can give the role to nothing.
    _, submit = _function(template, "PipelineSubmitJobFunction")
    granted = role_statements(template, _role_id(submit))
    (passes,) = [
        s for s in granted
        if "iam:PassRole" in as_list(s["Action"]) and "pods.eks" in json.dumps(s["Condition"])
    ]  # fmt: skip
    assert passes["Resource"] == {"Fn::GetAtt": [role_id, "Arn"]}
    actions = {a for s in granted for a in as_list(s["Action"])}
    assert "eks:CreatePodIdentityAssociation" in actions
    assert "eks:DeletePodIdentityAssociation" not in actions
    _, release = _function(template, "PipelineReleaseComputeFunction")
    actions = {
        a for s in role_statements(template, _role_id(release)) for a in as_list(s["Action"])
    }
    assert "eks:DeletePodIdentityAssociation" in actions
    assert "eks:CreatePodIdentityAssociation" not in actions
    assert not any(
        "pods.eks" in json.dumps(s.get("Condition", {}))
        for s in role_statements(template, _role_id(release))
    )
    _, monitor = _function(template, "PipelineMonitorFunction")
    monitor_actions = {
        a for s in role_statements(template, _role_id(monitor)) for a in as_list(s["Action"])
    }
    assert "eks:CreatePodIdentityAssociation" not in monitor_actions


def test_the_reaper_can_release_a_runs_compute(default_app: Synthesized) -> None:
    """A run stopped past its deadline never reaches ReleaseCompute: the reaper does it."""
    template = default_app.template("pipeline")
    _, reaper = _function(template, "PipelineReaper")
    assert reaper["Properties"]["Handler"] == "lambdas.pipeline.handlers.reap"
    variables = reaper["Properties"]["Environment"]["Variables"]
    assert {"WORKER_CLUSTER", "EKS_CLUSTER", "HYPERPOD_CLUSTER", "TRAINING_JOB_ROLE_ARN"} <= set(
        variables
    )
    assert _entries(template)[_role_id(reaper)]["KubernetesGroups"] == ["nova-mtrl:pipeline"]
    actions = {a for s in role_statements(template, _role_id(reaper)) for a in as_list(s["Action"])}
    assert {
        "ecs:DeleteService", "sagemaker:UpdateCluster", "eks:DeletePodIdentityAssociation",
    } <= actions  # fmt: skip


def test_a_restricted_group_brings_the_nova_plane_and_its_rights(pinned_app: Synthesized) -> None:
    """The launcher function (an image built at deploy time, in the cluster's network) reaches
    Kubernetes through a group of its own, whose rights are a Role in the kubeflow namespace;
    the job steps get the Nova plane's settings, invoke the launcher and read the Forge recipes;
    scaling passes the restricted groups' role to SageMaker."""
    template = pinned_app.template("pipeline")
    launcher_id, launcher = _function(template, "TrainingClusterControlNovaLauncherFunction")
    properties = launcher["Properties"]
    assert properties["PackageType"] == "Image"
    assert properties["ImageConfig"]["Command"] == ["lambdas.launcher.handler.launch_job"]
    assert properties["VpcConfig"]["SubnetIds"]
    assert properties["Environment"]["Variables"]["EKS_CLUSTER"] == "nova-mtrl-eks"
    entry = _entries(template)[_role_id(launcher)]
    assert (
        entry["KubernetesGroups"] == ["nova-mtrl:nova-launcher"] and "AccessPolicies" not in entry
    )
    (rbac,) = [r for r in template["Resources"].values() if r["Type"] == "Custom::KubernetesRbac"]
    objects = rbac_of("nova-mtrl", rbac["Properties"])
    assert objects == pipeline_rbac("nova-mtrl") + nova_launcher_rbac("nova-mtrl")
    role = next(o for o in objects if o["kind"] == "Role")
    assert role["metadata"]["namespace"] == "kubeflow"
    for step in ("SubmitJob", "ReleaseCompute"):
        _, function = _function(template, f"Pipeline{step}Function")
        variables = function["Properties"]["Environment"]["Variables"]
        assert (variables["NOVA_INSTANCE_GROUP"], variables["NOVA_INSTANCE_TYPE"]) == (
            "nova", "ml.p5.48xlarge",
        )  # fmt: skip
        assert variables["NOVA_LAUNCHER_FUNCTION"] == {"Ref": launcher_id}
        statements = role_statements(template, _role_id(function))
        (invoke,) = [s for s in statements if "lambda:InvokeFunction" in as_list(s["Action"])]
        assert invoke["Resource"] == {"Fn::GetAtt": [launcher_id, "Arn"]}
    _, submit = _function(template, "PipelineSubmitJobFunction")
    (read,) = [
        s for s in role_statements(template, _role_id(submit))
        if as_list(s["Action"]) == ["s3:GetObject"]
    ]  # fmt: skip
    assert sorted(read["Resource"]) == sorted(
        "arn:aws:s3:::" + FORGE_RECIPE_SOURCE.format(recipe=path).removeprefix("s3://")
        for path in [*FORGE_RECIPES.values(), FORGE_EVALUATION_RECIPE]
    )
    _, scale = _function(template, "PipelineScaleUpFunction")
    passed = [
        s["Resource"] for s in role_statements(template, _role_id(scale))
        if "iam:PassRole" in as_list(s["Action"])
    ]  # fmt: skip
    assert any("RestrictedExecutionRole" in json.dumps(resource) for resource in passed)
    # HyperPod keeps an EKS access entry for every group's execution role, the restricted one's
    # too (ClusterMetadata.EksRoleAccessEntries): scaling may manage those two entries only.
    entries = [
        s for s in role_statements(template, _role_id(scale))
        if "eks:principalArn" in json.dumps(s.get("Condition", {}))
    ]  # fmt: skip
    assert {a for s in entries for a in as_list(s["Action"])} == {
        "eks:CreateAccessEntry", "eks:DescribeAccessEntry", "eks:AssociateAccessPolicy",
        "eks:DeleteAccessEntry",
    }  # fmt: skip
    for statement in entries:
        principals = statement["Condition"]["StringEquals"]["eks:principalArn"]
        assert len(principals) == 2
        assert "RestrictedExecutionRole" in json.dumps(principals)
    # Associating an access policy: never an admin one (the node roles made cluster admin).
    (associate,) = [s for s in entries if "eks:AssociateAccessPolicy" in as_list(s["Action"])]
    assert as_list(associate["Action"]) == ["eks:AssociateAccessPolicy"]
    refused = [arn_text(a) for a in associate["Condition"]["ArnNotLike"]["eks:policyArn"]]
    assert refused == [
        "arn:aws:eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy",
        "arn:aws:eks::aws:cluster-access-policy/AmazonEKSAdminPolicy",
    ]


def test_without_a_restricted_group_there_is_no_nova_plane(open_weights_app: Synthesized) -> None:
    template = open_weights_app.template("pipeline")
    assert not [k for k in template["Resources"] if "NovaLauncher" in k]
    _, submit = _function(template, "PipelineSubmitJobFunction")
    assert "NOVA_INSTANCE_GROUP" not in submit["Properties"]["Environment"]["Variables"]
    statements = role_statements(template, _role_id(submit))
    assert not [s for s in statements if "lambda:InvokeFunction" in as_list(s["Action"])]


def test_run_pods_read_only_the_hub_token_secrets_the_presets_name(
    nova_app: Synthesized, default_app: Synthesized
) -> None:
    """Secrets Manager ends a secret's ARN in a hyphen and six random characters (botocore's
    model says so of CreateSecret's Name and ARN): the grant names the secret and leaves those
    open. Without a preset naming one, nothing of Secrets Manager is granted."""
    model = botocore.session.get_session().get_service_model("secretsmanager")
    create = model.operation_model("CreateSecret")
    assert (
        "adds a hyphen and six random characters"
        in create.input_shape.members["Name"].documentation
    )
    template = nova_app.template("pipeline")
    (role_id,) = [
        i for i, r in template["Resources"].items()
        if r["Type"] == "AWS::IAM::Role" and i.startswith("TrainingClusterControlJobRole")
    ]  # fmt: skip
    (read,) = [
        s for s in role_statements(template, role_id)
        if any(a.startswith("secretsmanager:") for a in as_list(s["Action"]))
    ]  # fmt: skip
    assert as_list(read["Action"]) == ["secretsmanager:GetSecretValue"]
    assert _joined(read["Resource"]).endswith(f":secret:{HUB_TOKEN_SECRET}-??????")
    for app, expected in ((nova_app, [read]), (default_app, [])):
        granted = [s for _, s in policy_statements(app.template("pipeline"))]
        assert [s for s in granted if "secretsmanager" in json.dumps(s)] == expected
