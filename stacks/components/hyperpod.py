"""The HyperPod cluster (EKS orchestrator) that runs vLLM generation and the GRPO trainer."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from aws_cdk import Annotations, ArnFormat, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_sagemaker as sagemaker
from constructs import Construct, IDependable

from domain.presets import ModelPreset
from stacks.components.nag import (
    Wildcard,
    acknowledge,
    acknowledge_managed_policy,
    acknowledge_no_resource_type,
    acknowledge_resource,
)
from stacks.components.network import interface_scope
from stacks.components.storage import lifecycle_bucket_name, lifecycle_scripts_uri
from stacks.components.trainer_image import TrainerImage
from stacks.config import ExistingHyperPodCluster, HyperPodInstanceGroup, PlatformConfig

INSTANCE_POLICY = "AmazonSageMakerClusterInstanceRolePolicy"
LIFECYCLE_SCRIPTS_READ = (
    "Nodes read their lifecycle scripts (aws-cdk-lib's grant_read: read-only, that bucket only)."
)


@dataclass(frozen=True)
class HyperPodProps:
    """What the deployment's HyperPod cluster is (its configuration's HyperPod keys,
    `hyperpod_props`)."""

    name_prefix: str
    instance_groups: tuple[HyperPodInstanceGroup, ...]
    presets: Mapping[str, ModelPreset]  # whose trainer images the nodes may pull
    existing: ExistingHyperPodCluster | None
    nova_notice: str | None  # why the deployment has no Nova group, when it has none

    @property
    def cluster_name(self) -> str:
        return self.existing.cluster_name if self.existing else f"{self.name_prefix}-hyperpod"


def hyperpod_props(config: PlatformConfig) -> HyperPodProps:
    return HyperPodProps(
        name_prefix=config.name_prefix, instance_groups=tuple(config.hyperpod_instance_groups),
        presets=config.model_presets, existing=config.existing_hyperpod_cluster,
        nova_notice=config.nova_notice,
    )  # fmt: skip


class HyperPodCluster(Construct):
    """A HyperPod cluster on the given EKS cluster, or an existing one referenced by name.

    Attributes: `cluster_name`, `cluster_arn`, `execution_role_arn` (None for an existing
    cluster unless configured), `restricted_execution_role` (the restricted groups' role, which
    is all the permissions a Nova job there has; None without restricted groups), `resource`
    (the CfnCluster, None for an existing cluster).
    HyperPod cluster ARNs end in an id SageMaker assigns (`cluster/<12 characters>`), not the
    name: an existing cluster's ARN is matched within the account and region.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        props: HyperPodProps,
        eks_cluster_arn: str,
        security_group_id: str,
        vpc: ec2.IVpc,
        subnets: ec2.SubnetSelection,
        depends_on: list[IDependable],
        trainer_image: TrainerImage | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        self.trainer_image_uri = trainer_image.image_uri if trainer_image else None
        self.resource: sagemaker.CfnCluster | None = None
        self.restricted_execution_role: iam.Role | None = None
        self.cluster_name = props.cluster_name
        existing = props.existing
        if existing:
            self.cluster_arn = _cluster_arn(self, "*")
            self.execution_role_arn = existing.execution_role_arn
            return
        subnet_ids = vpc.select_subnets(subnet_type=subnets.subnet_type).subnet_ids
        lifecycle_bucket = s3.Bucket.from_bucket_name(
            self, "LifecycleBucket", lifecycle_bucket_name(props.name_prefix)
        )
        image_repositories = ecr_repositories(Stack.of(self), props.presets, props.name_prefix)
        if trainer_image is not None:
            image_repositories.append(trainer_image.repository_arn)
        role = self._execution_role(
            "ExecutionRole",
            "HyperPod GPU nodes: node agents, VPC CNI, image pulls, lifecycle scripts",
            subnet_ids,
            security_group_id,
            eks_cluster_arn,
            image_repositories=image_repositories,
            lifecycle_bucket=lifecycle_bucket,
        )
        self.execution_role_arn: str | None = role.role_arn
        standard = [group for group in props.instance_groups if not group.restricted]
        restricted_groups = None
        if restricted := [group for group in props.instance_groups if group.restricted]:
            # A restricted group's execution role is the only identity its Nova jobs have
            # (SageMaker Developer Guide, "Creating a HyperPod EKS cluster with RIG").
            # It pulls no image of ours: a restricted group runs Nova's images only.
            self.restricted_execution_role = self._execution_role(
                "RestrictedExecutionRole",
                "HyperPod restricted (Nova) nodes and the Nova jobs on them",
                subnet_ids,
                security_group_id,
                eks_cluster_arn,
                image_repositories=[],
            )
            restricted_groups = [
                _restricted_group(group, self.restricted_execution_role.role_arn)
                for group in restricted
            ]
        elif props.nova_notice:
            Annotations.of(self).add_warning_v2("nova-mtrl:no-nova-group", props.nova_notice)
        self.resource = sagemaker.CfnCluster(
            self,
            "Cluster",
            cluster_name=self.cluster_name,
            orchestrator=sagemaker.CfnCluster.OrchestratorProperty(
                eks=sagemaker.CfnCluster.ClusterOrchestratorEksConfigProperty(
                    cluster_arn=eks_cluster_arn
                )
            ),
            node_recovery="Automatic",
            # Continuous provisioning lets instance groups start at 0 and scale per run.
            node_provisioning_mode="Continuous",
            vpc_config=sagemaker.CfnCluster.VpcConfigProperty(
                security_group_ids=[security_group_id], subnets=subnet_ids
            ),
            instance_groups=[
                sagemaker.CfnCluster.ClusterInstanceGroupProperty(
                    instance_group_name=group.name,
                    instance_type=group.instance_type,
                    instance_count=group.count,
                    threads_per_core=group.threads_per_core,
                    execution_role=role.role_arn,
                    life_cycle_config=sagemaker.CfnCluster.ClusterLifeCycleConfigProperty(
                        source_s3_uri=lifecycle_scripts_uri(props.name_prefix),
                        on_create="on_create.sh",
                    ),
                    instance_storage_configs=[_ebs_volume(group.ebs_volume_gb)],
                )
                for group in standard
            ],
            restricted_instance_groups=restricted_groups,
        )
        self.cluster_arn = self.resource.attr_cluster_arn
        # Creation must not race the roles' policies or the cluster's add-ons and nodes.
        self.resource.node.add_dependency(role)
        if self.restricted_execution_role is not None:
            self.resource.node.add_dependency(self.restricted_execution_role)
        for dependency in depends_on:
            self.resource.node.add_dependency(dependency)

    def _execution_role(
        self,
        construct_id: str,
        description: str,
        subnet_ids: list[str],
        security_group_id: str,
        eks_cluster_arn: str,
        *,
        image_repositories: list[str],
        lifecycle_bucket: s3.IBucket | None = None,
    ) -> iam.Role:
        """A nodes' execution role; `lifecycle_bucket`: the scripts the nodes run (standard
        groups only: restricted groups run none)."""
        stack = Stack.of(self)
        role = iam.Role(
            self,
            construct_id,
            assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com"),
            description=description,
            managed_policies=[iam.ManagedPolicy.from_aws_managed_policy_name(INSTANCE_POLICY)],
        )
        acknowledge_managed_policy(
            role, INSTANCE_POLICY,
            "HyperPod requires its AWS-maintained instance policy on the cluster execution role "
            "(node health agents, CloudWatch metrics); AWS keeps it in step with HyperPod.",
        )  # fmt: skip
        _grant_node_network(role, stack, subnet_ids, security_group_id)
        if image_repositories:
            _grant_image_pulls(role, image_repositories)
        role.add_to_policy(
            iam.PolicyStatement(
                sid="PodIdentity",
                actions=["eks-auth:AssumeRoleForPodIdentity"],
                resources=[eks_cluster_arn],
            )
        )
        acknowledge_no_resource_type(role)  # EC2 Describe*, ecr:GetAuthorizationToken
        if lifecycle_bucket is not None:
            _grant_lifecycle_read(role, lifecycle_bucket)
        return role


def _grant_node_network(
    role: iam.Role, stack: Stack, subnet_ids: list[str], security_group_id: str
) -> None:
    """The nodes' network interfaces, made by HyperPod and the VPC CNI in our subnets and
    security group (named), and the network described."""
    create, network_interfaces = interface_scope(
        stack, subnet_ids=subnet_ids, security_group_id=security_group_id
    )
    role.add_to_policy(
        iam.PolicyStatement(
            sid="CreateNodeInterfacesInOurSubnets",
            actions=["ec2:CreateNetworkInterface"],
            resources=create,
        )
    )
    role.add_to_policy(
        iam.PolicyStatement(
            sid="ManageNodeInterfaces",
            actions=[
                "ec2:AssignPrivateIpAddresses",
                "ec2:AttachNetworkInterface",
                "ec2:CreateNetworkInterfacePermission",
                "ec2:DeleteNetworkInterface",
                "ec2:DeleteNetworkInterfacePermission",
                "ec2:DetachNetworkInterface",
                "ec2:ModifyNetworkInterfaceAttribute",
                "ec2:UnassignPrivateIpAddresses",
            ],
            resources=[network_interfaces],
        )
    )
    role.add_to_policy(
        iam.PolicyStatement(
            sid="TagNodeInterfaces",
            actions=["ec2:CreateTags"],
            resources=[network_interfaces],
        )
    )
    role.add_to_policy(
        iam.PolicyStatement(
            sid="DescribeNetwork",
            actions=[
                "ec2:DescribeDhcpOptions",
                "ec2:DescribeInstances",
                "ec2:DescribeInstanceTypes",
                "ec2:DescribeNetworkInterfaces",
                "ec2:DescribeSecurityGroups",
                "ec2:DescribeSubnets",
                "ec2:DescribeTags",
                "ec2:DescribeVpcs",
            ],
            resources=["*"],
        )
    )
    # HyperPod and the VPC CNI create the nodes' interfaces; the subnets and security group
    # are named.
    acknowledge_resource(role, network_interfaces, Wildcard.ASSIGNED_BY_AWS)


def _grant_image_pulls(role: iam.Role, repositories: list[str]) -> None:
    """The kubelet pulls the presets' images with the nodes' role: Nova's live in AWS's account."""
    role.add_to_policy(
        iam.PolicyStatement(
            sid="PullImages",
            actions=[
                "ecr:BatchCheckLayerAvailability",
                "ecr:BatchGetImage",
                "ecr:GetDownloadUrlForLayer",
            ],
            resources=repositories,
        )
    )
    role.add_to_policy(
        iam.PolicyStatement(sid="EcrLogin", actions=["ecr:GetAuthorizationToken"], resources=["*"])
    )


def _grant_lifecycle_read(role: iam.Role, bucket: s3.IBucket) -> None:
    """The lifecycle scripts the nodes run (standard groups only)."""
    bucket.grant_read(role)
    acknowledge_resource(role, bucket.arn_for_objects("*"), LIFECYCLE_SCRIPTS_READ)
    for action in ("s3:GetBucket*", "s3:GetObject*", "s3:List*"):
        acknowledge(role, f"AwsSolutions-IAM5[Action::{action}]", LIFECYCLE_SCRIPTS_READ)


def _restricted_group(
    group: HyperPodInstanceGroup, role_arn: str
) -> sagemaker.CfnCluster.ClusterRestrictedInstanceGroupProperty:
    """A restricted group with its FSx for Lustre (`HyperPodInstanceGroup` requires one)."""
    fsx = group.fsx
    return sagemaker.CfnCluster.ClusterRestrictedInstanceGroupProperty(
        instance_group_name=group.name,
        instance_type=group.instance_type,
        instance_count=group.count,
        threads_per_core=group.threads_per_core,
        execution_role=role_arn,
        environment_config=sagemaker.CfnCluster.EnvironmentConfigProperty(
            f_sx_lustre_config=sagemaker.CfnCluster.FSxLustreConfigProperty(
                size_in_gib=fsx.size_gib,
                per_unit_storage_throughput=fsx.per_unit_storage_throughput,
            )
        ),
        instance_storage_configs=[_ebs_volume(group.ebs_volume_gb)],
    )


def _ebs_volume(size_gb: int) -> sagemaker.CfnCluster.ClusterInstanceStorageConfigProperty:
    return sagemaker.CfnCluster.ClusterInstanceStorageConfigProperty(
        ebs_volume_config=sagemaker.CfnCluster.ClusterEbsVolumeConfigProperty(
            volume_size_in_gb=size_gb
        )
    )


def hyperpod_cluster_name(config: PlatformConfig) -> str:
    return hyperpod_props(config).cluster_name


def _cluster_arn(scope: Construct, cluster_id: str) -> str:
    return Stack.of(scope).format_arn(
        service="sagemaker",
        resource="cluster",
        resource_name=cluster_id,
        arn_format=ArnFormat.SLASH_RESOURCE_NAME,
    )


# An image in ECR: <account>.dkr.ecr.<region>.amazonaws.com/<repository>[:tag|@digest], where a
# preset may write {account}, {region} and {prefix} for the deployment's.
_ECR_IMAGE = re.compile(
    r"^(?P<account>\{account\}|\d{12})\.dkr\.ecr\.(?P<region>\{region\}|[a-z0-9-]+)\.amazonaws\.com/"
    r"(?P<repository>[^:@]+)"
)


def ecr_repositories(
    stack: Stack, presets: Mapping[str, ModelPreset], name_prefix: str
) -> list[str]:
    """The ECR repositories of the model presets' images (none for images elsewhere)."""
    found = set()
    for preset in presets.values():
        for image in [preset.trainer_image] if preset.trainer_image else []:
            match = _ECR_IMAGE.match(image)
            if match is None:
                continue
            account = stack.account if match["account"] == "{account}" else match["account"]
            region = stack.region if match["region"] == "{region}" else match["region"]
            repository = match["repository"].replace("{prefix}", name_prefix)
            found.add(f"arn:{stack.partition}:ecr:{region}:{account}:repository/{repository}")
    return sorted(found)
