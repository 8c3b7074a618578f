"""The EKS cluster for HyperPod: public endpoint, auth mode, add-ons and their order, access entries."""

from __future__ import annotations

import json

import pytest

from stacks.components.eks import CONTAINER_LOGS_ACCOUNT, TRAINING_OPERATOR_ACCOUNT
from tests.conftest import ADMIN_ROLE, Synthesized, synthesize


def _addons(app: Synthesized) -> dict[str, tuple[str, dict]]:
    return {
        addon["Properties"]["AddonName"]: (logical_id, addon)
        for logical_id, addon in app.resources("compute", "AWS::EKS::Addon").items()
    }


def test_cluster_endpoint_auth_logging_and_encryption(default_app: Synthesized) -> None:
    _, cluster = default_app.one("compute", "AWS::EKS::Cluster")
    properties = cluster["Properties"]
    assert properties["Name"] == "nova-mtrl-eks"
    assert properties["Version"] == default_app.config.eks_version
    # Nodes join through the private endpoint (the EKS User Guide's private cluster
    # requirements: "required for nodes to register"; public access "is optional"); functions
    # use it too. By default there is no public endpoint (tests/test_cluster_network.py).
    assert properties["ResourcesVpcConfig"]["EndpointPrivateAccess"] is True
    assert properties["ResourcesVpcConfig"]["EndpointPublicAccess"] is False
    # Access entries only: HyperPod's EKS prerequisites take API (as well as
    # API_AND_CONFIG_MAP), and nothing here reads the aws-auth ConfigMap.
    assert properties["AccessConfig"]["AuthenticationMode"] == "API"
    assert properties["ComputeConfig"] == {"Enabled": False}
    assert properties["BootstrapSelfManagedAddons"] is False
    enabled = properties["Logging"]["ClusterLogging"]["EnabledTypes"]
    assert {entry["Type"] for entry in enabled} == {
        "api",
        "audit",
        "authenticator",
        "controllerManager",
        "scheduler",
    }
    assert properties["EncryptionConfig"][0]["Resources"] == ["secrets"]


def test_no_kubectl_layer_or_cdks_kubectl_custom_resources_are_synthesized(
    every_app: dict[str, Synthesized],
) -> None:
    for synthesized in every_app.values():
        types = {
            resource["Type"] for resource in synthesized.template("compute")["Resources"].values()
        }
        assert "AWS::Lambda::LayerVersion" not in types
        assert not any(t.startswith("Custom::AWSCDK-EKS") for t in types)


def test_system_node_group_follows_config(default_app: Synthesized) -> None:
    _, nodegroup = default_app.one("compute", "AWS::EKS::Nodegroup")
    system = default_app.config.system_node_group
    assert nodegroup["Properties"]["ScalingConfig"] == {
        "MinSize": system.min_size,
        "DesiredSize": system.desired_size,
        "MaxSize": system.max_size,
    }
    assert nodegroup["Properties"]["InstanceTypes"] == [system.instance_type]


def test_addons_needed_by_hyperpod_in_a_working_order(default_app: Synthesized) -> None:
    addons = _addons(default_app)
    assert set(addons) == {
        "vpc-cni",
        "kube-proxy",
        "eks-pod-identity-agent",
        "coredns",
        "cert-manager",
        "amazon-sagemaker-hyperpod-training-operator",
        "amazon-cloudwatch-observability",
    }
    nodegroup_id, nodegroup = default_app.one("compute", "AWS::EKS::Nodegroup")
    # Nodes only become Ready with the CNI in place; CoreDNS only turns ACTIVE with nodes.
    for name in ("vpc-cni", "kube-proxy", "eks-pod-identity-agent"):
        assert addons[name][0] in nodegroup["DependsOn"]
    assert nodegroup_id in addons["coredns"][1]["DependsOn"]
    hyperpod_id, _ = default_app.one("compute", "AWS::SageMaker::Cluster")
    operator = addons["amazon-sagemaker-hyperpod-training-operator"][1]
    assert hyperpod_id in operator["DependsOn"]
    assert addons["cert-manager"][0] in operator["DependsOn"]
    (association,) = operator["Properties"]["PodIdentityAssociations"]
    role_id = association["RoleArn"]["Fn::GetAtt"][0]
    role = default_app.template("compute")["Resources"][role_id]
    trusted = role["Properties"]["AssumeRolePolicyDocument"]["Statement"][0]["Principal"]["Service"]
    assert trusted == "pods.eks.amazonaws.com"


def test_container_logs_go_to_cloudwatch_through_pod_identity(default_app: Synthesized) -> None:
    """`mtrl logs --plane trainer` reads the run's pod lines from Container Insights."""
    _, addon = _addons(default_app)["amazon-cloudwatch-observability"]
    (association,) = addon["Properties"]["PodIdentityAssociations"]
    assert association["ServiceAccount"] == "cloudwatch-agent"
    role = default_app.template("compute")["Resources"][association["RoleArn"]["Fn::GetAtt"][0]]
    assert json.dumps(role["Properties"]["ManagedPolicyArns"]).endswith(
        ':iam::aws:policy/CloudWatchAgentServerPolicy"]]}]'
    )
    nodegroup_id, _ = default_app.one("compute", "AWS::EKS::Nodegroup")
    assert nodegroup_id in addon["DependsOn"]  # its agents are pods: they need nodes


def test_training_operator_can_be_left_out(tmp_path) -> None:
    from tests.conftest import synthesize

    synthesized = synthesize({"install_training_operator": "false"}, tmp_path)
    assert "amazon-sagemaker-hyperpod-training-operator" not in _addons(synthesized)
    assert "cert-manager" not in _addons(synthesized)


def test_admin_roles_get_cluster_admin_access_entries(pinned_app: Synthesized) -> None:
    # The configured admin's entry (the other is the chart installer's).
    (entry,) = [
        entry
        for entry in pinned_app.resources("compute", "AWS::EKS::AccessEntry").values()
        if entry["Properties"]["PrincipalArn"] == ADMIN_ROLE
    ]
    (policy,) = entry["Properties"]["AccessPolicies"]
    assert json.dumps(policy["PolicyArn"]).endswith(
        ':cluster-access-policy/AmazonEKSClusterAdminPolicy"]]}'
    )
    assert policy["AccessScope"] == {"Type": "cluster"}


def test_existing_cluster_is_referenced_not_created(existing_app: Synthesized) -> None:
    assert not existing_app.resources("compute", "AWS::EKS::Cluster")
    assert not existing_app.resources("compute", "AWS::EKS::Nodegroup")
    assert existing_app.template("compute")["Outputs"]["EksClusterName"]["Value"] == "team-eks"


def test_kubernetes_1_35_is_accepted_with_a_warning_that_it_is_unverified(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    app = synthesize({"eks_version": "1.35"}, tmp_path_factory.mktemp("k8s-1-35"))
    _, cluster = app.one("compute", "AWS::EKS::Cluster")
    assert cluster["Properties"]["Version"] == "1.35"
    warnings = _warnings(app)
    assert any("Kubernetes 1.35" in text and "unverified" in text for text in warnings), warnings


def test_a_listed_version_gets_no_such_warning(default_app: Synthesized) -> None:
    assert not any("unverified" in text for text in _warnings(default_app))


def _warnings(app: Synthesized) -> list[str]:
    """What synth warned about (cdk.out/<stack>.metadata.json)."""
    return [
        str(entry["data"])
        for metadata in app.outdir.glob("*.metadata.json")
        for entries in json.loads(metadata.read_text()).values()
        for entry in entries
        if entry["type"] == "aws:cdk:warning"
    ]


def test_the_add_ons_roles_admit_only_their_service_account_on_this_cluster(
    default_app: Synthesized,
) -> None:
    template = default_app.template("compute")
    cluster_id = next(
        i for i, r in template["Resources"].items() if r["Type"] == "AWS::EKS::Cluster"
    )
    trusted = {}
    for addon in template["Resources"].values():
        if addon["Type"] != "AWS::EKS::Addon":
            continue
        for association in addon["Properties"].get("PodIdentityAssociations", []):
            role = template["Resources"][association["RoleArn"]["Fn::GetAtt"][0]]
            (trust,) = role["Properties"]["AssumeRolePolicyDocument"]["Statement"]
            trusted[association["ServiceAccount"]] = trust["Condition"]
    assert set(trusted) == {CONTAINER_LOGS_ACCOUNT, TRAINING_OPERATOR_ACCOUNT}
    for account, condition in trusted.items():
        assert condition == {
            "StringEquals": {
                "aws:RequestTag/eks-cluster-name": {"Ref": cluster_id},
                "aws:RequestTag/kubernetes-service-account": account,
            }
        }
