"""The HyperPod cluster: EKS orchestrator, instance groups from config, ordering, execution role."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from aws_cdk import cx_api as cxapi

from stacks.app_builder import build_app
from tests.conftest import NO_BUNDLING, Synthesized, as_list, role_statements, synthesize


def test_cluster_orchestrated_by_our_eks_cluster(default_app: Synthesized) -> None:
    _, hyperpod = default_app.one("compute", "AWS::SageMaker::Cluster")
    eks_id, _ = default_app.one("compute", "AWS::EKS::Cluster")
    properties = hyperpod["Properties"]
    assert properties["ClusterName"] == "nova-mtrl-hyperpod"
    assert properties["Orchestrator"] == {"Eks": {"ClusterArn": {"Fn::GetAtt": [eks_id, "Arn"]}}}
    assert properties["NodeRecovery"] == "Automatic"
    assert properties["NodeProvisioningMode"] == "Continuous"
    assert properties["VpcConfig"]["SecurityGroupIds"] == [
        {"Fn::GetAtt": [eks_id, "ClusterSecurityGroupId"]}
    ]


def test_instance_groups_follow_config_including_scale_to_zero(tmp_path) -> None:
    groups = [
        {"name": "gpu", "instance_type": "ml.p5.48xlarge", "count": 0, "ebs_volume_gb": 1000},
        {"name": "gen", "instance_type": "ml.g5.48xlarge", "count": 2, "threads_per_core": 2},
    ]
    synthesized = synthesize({"hyperpod_instance_groups": json.dumps(groups)}, tmp_path)
    _, hyperpod = synthesized.one("compute", "AWS::SageMaker::Cluster")
    rendered = hyperpod["Properties"]["InstanceGroups"]
    assert [
        (g["InstanceGroupName"], g["InstanceType"], g["InstanceCount"], g["ThreadsPerCore"])
        for g in rendered
    ] == [
        ("gpu", "ml.p5.48xlarge", 0, 1),
        ("gen", "ml.g5.48xlarge", 2, 2),
    ]
    volumes = [
        g["InstanceStorageConfigs"][0]["EbsVolumeConfig"]["VolumeSizeInGB"] for g in rendered
    ]
    assert volumes == [1000, 500]
    for group in rendered:
        lifecycle = group["LifeCycleConfig"]
        assert lifecycle["OnCreate"] == "on_create.sh"
        assert "s3://sagemaker-nova-mtrl-lc-" in json.dumps(lifecycle["SourceS3Uri"])


def test_creation_waits_for_role_addons_and_nodes(default_app: Synthesized) -> None:
    _, hyperpod = default_app.one("compute", "AWS::SageMaker::Cluster")
    depends_on = set(hyperpod["DependsOn"])
    compute = default_app.template("compute")["Resources"]
    role_id = hyperpod["Properties"]["InstanceGroups"][0]["ExecutionRole"]["Fn::GetAtt"][0]
    role_policies = {
        logical_id
        for logical_id, resource in compute.items()
        if resource["Type"] == "AWS::IAM::Policy"
        and {"Ref": role_id} in resource["Properties"]["Roles"]
    }
    assert role_policies and role_policies <= depends_on
    nodegroup_id, _ = default_app.one("compute", "AWS::EKS::Nodegroup")
    addon_ids = {
        logical_id
        for logical_id, addon in default_app.resources("compute", "AWS::EKS::Addon").items()
        if addon["Properties"]["AddonName"]
        in {"vpc-cni", "kube-proxy", "eks-pod-identity-agent", "coredns"}
    }
    assert {nodegroup_id, *addon_ids} <= depends_on


def test_execution_role_names_subnets_and_reads_only_its_bucket(default_app: Synthesized) -> None:
    _, hyperpod = default_app.one("compute", "AWS::SageMaker::Cluster")
    role_id = hyperpod["Properties"]["InstanceGroups"][0]["ExecutionRole"]["Fn::GetAtt"][0]
    role = default_app.template("compute")["Resources"][role_id]
    assert role["Properties"]["AssumeRolePolicyDocument"]["Statement"][0]["Principal"] == {
        "Service": "sagemaker.amazonaws.com"
    }
    managed = json.dumps(role["Properties"]["ManagedPolicyArns"])
    assert "AmazonSageMakerClusterInstanceRolePolicy" in managed
    statements = role_statements(default_app.template("compute"), role_id)
    by_sid = {s.get("Sid"): s for s in statements}
    create = by_sid["CreateNodeInterfacesInOurSubnets"]
    resources = json.dumps(create["Resource"])
    assert ":subnet/" in resources and ":security-group/" in resources
    s3_statements = [
        s for s in statements if any(a.startswith("s3:") for a in as_list(s["Action"]))
    ]
    assert s3_statements
    for statement in s3_statements:
        assert all(
            not a.startswith("s3:Put") and not a.startswith("s3:Delete")
            for a in as_list(statement["Action"])
        )
        assert "sagemaker-nova-mtrl-lc-" in json.dumps(statement["Resource"])


def test_existing_hyperpod_cluster_is_referenced_not_created(
    existing_hyperpod_app: Synthesized,
) -> None:
    assert not existing_hyperpod_app.resources("compute", "AWS::SageMaker::Cluster")
    outputs = existing_hyperpod_app.template("compute")["Outputs"]
    assert outputs["HyperPodClusterName"]["Value"] == "team-hyperpod"


def test_new_hyperpod_on_an_existing_eks_cluster(existing_app: Synthesized) -> None:
    _, hyperpod = existing_app.one("compute", "AWS::SageMaker::Cluster")
    orchestrator = json.dumps(hyperpod["Properties"]["Orchestrator"])
    assert ":cluster/team-eks" in orchestrator
    assert hyperpod["Properties"]["VpcConfig"]["SecurityGroupIds"] == ["sg-0123456789abcdef0"]


def test_nodes_pull_the_presets_images_from_their_repositories_only(
    default_app: Synthesized,
) -> None:
    """The kubelet pulls with the execution role: the presets' images — the qwen3-8b preset's
    trainer is the image `cdk deploy` builds (llm_trainer/Dockerfile), in the CDK assets
    repository; images outside ECR need no grant. Nova's run on the restricted group, whose
    images AWS provides."""
    _, hyperpod = default_app.one("compute", "AWS::SageMaker::Cluster")
    role_id = hyperpod["Properties"]["InstanceGroups"][0]["ExecutionRole"]["Fn::GetAtt"][0]
    statements = role_statements(default_app.template("compute"), role_id)
    (pull,) = [s for s in statements if s.get("Sid") == "PullImages"]
    resources = sorted(json.dumps(r) for r in as_list(pull["Resource"]))
    (ours,) = resources
    assert '"AWS::AccountId"' in ours and "container-assets-${AWS::AccountId}" in ours
    assert "*" not in "".join(resources)


def test_the_lifecycle_script_logs_to_its_file_and_to_stdout(tmp_path) -> None:
    """stdout is what reaches the cluster's CloudWatch log group; the file stays on the node."""
    script = Path(__file__).parents[1] / "stacks" / "assets" / "hyperpod_lifecycle" / "on_create.sh"
    done = subprocess.run(
        ["bash", str(script)],
        env={**os.environ, "PROVISION_LOG_DIR": str(tmp_path)},
        capture_output=True,
        text=True,
        check=True,
    )
    assert "nova-mtrl on_create start" in done.stdout
    assert "nova-mtrl on_create done" in done.stdout
    written = (tmp_path / "provisioning.log").read_text()
    assert written.splitlines() == done.stdout.splitlines()


def test_a_restricted_group_gets_its_fsx_and_a_role_of_its_own(pinned_app: Synthesized) -> None:
    """CloudFormation's AWS::SageMaker::Cluster RestrictedInstanceGroups: execution role,
    FSx for Lustre, and no lifecycle scripts (restricted nodes run none)."""
    _, hyperpod = pinned_app.one("compute", "AWS::SageMaker::Cluster")
    properties = hyperpod["Properties"]
    assert [g["InstanceGroupName"] for g in properties["InstanceGroups"]] == ["gpu"]
    (nova,) = properties["RestrictedInstanceGroups"]
    assert (nova["InstanceGroupName"], nova["InstanceType"], nova["InstanceCount"]) == (
        "nova",
        "ml.p5.48xlarge",
        0,
    )
    assert nova["EnvironmentConfig"] == {
        "FSxLustreConfig": {"SizeInGiB": 2400, "PerUnitStorageThroughput": 250}
    }
    assert "LifeCycleConfig" not in nova
    standard_role = properties["InstanceGroups"][0]["ExecutionRole"]["Fn::GetAtt"][0]
    restricted_role = nova["ExecutionRole"]["Fn::GetAtt"][0]
    assert restricted_role != standard_role and restricted_role.startswith(
        "HyperPodRestrictedExecutionRole"
    )
    template = pinned_app.template("compute")
    actions = {a for s in role_statements(template, restricted_role) for a in as_list(s["Action"])}
    assert not any(action.startswith("s3:") for action in actions)  # no lifecycle bucket
    # No image of ours: a restricted group runs Nova's images only (AWS provides them). The
    # Nova job's own rights are granted to this role by the pipeline stack (tests/iam/).
    assert not any(action.startswith("ecr:") for action in actions)
    assert "eks-auth:AssumeRoleForPodIdentity" in actions


def test_without_restricted_groups_the_cluster_has_none(open_weights_app: Synthesized) -> None:
    _, hyperpod = open_weights_app.one("compute", "AWS::SageMaker::Cluster")
    assert "RestrictedInstanceGroups" not in hyperpod["Properties"]
    assert not [
        key
        for key in open_weights_app.resources("compute", "AWS::IAM::Role")
        if "Restricted" in key
    ]


def test_the_default_deployment_is_nova_ready(default_app: Synthesized) -> None:
    """cdk.json names the GPU group only: the restricted group beside it is the config's
    default, at 0 nodes, with the FSx for Lustre AWS's own Nova sample gives it."""
    _, hyperpod = default_app.one("compute", "AWS::SageMaker::Cluster")
    (restricted,) = hyperpod["Properties"]["RestrictedInstanceGroups"]
    assert restricted["InstanceGroupName"] == "nova" and restricted["InstanceCount"] == 0
    assert restricted["InstanceType"] == "ml.p5.48xlarge"
    assert restricted["EnvironmentConfig"]["FSxLustreConfig"] == {
        "SizeInGiB": 9600,
        "PerUnitStorageThroughput": 250,
    }


def test_where_nova_is_not_published_synth_says_why_and_deploys_without_it(
    tmp_path: Path,
) -> None:
    app, config = build_app(
        {**NO_BUNDLING, "region": "eu-west-1", "account": "111122223333"}, outdir=str(tmp_path)
    )
    assembly = app.synth()
    assert config.nova_group is None
    (compute,) = [s for s in assembly.stacks if s.stack_name.endswith("-compute")]
    warnings = [
        message.entry.data
        for message in compute.messages
        if message.level == cxapi.SynthesisMessageLevel.WARNING
    ]
    assert any(
        str(data).startswith("no restricted instance group for Nova: AWS's launcher as deployed")
        and "[ack: nova-mtrl:no-nova-group]" in str(data)
        for data in warnings
    ), warnings
    assert "RestrictedInstanceGroups" not in json.dumps(compute.template)
