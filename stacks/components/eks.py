"""The EKS cluster that orchestrates HyperPod: a private endpoint (a public one only from the
addresses an operator names), access entries only, add-ons."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

from aws_cdk import Annotations
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from constructs import Construct, IDependable

from domain.service_logs import (
    EKS_CONTAINER_INSIGHTS,
    eks_container_insights_group,
    eks_control_plane_group,
)
from stacks.components.functions import ClusterNetwork
from stacks.components.log_groups import service_log_group
from stacks.components.nag import acknowledge, acknowledge_managed_policy
from stacks.config import (
    UNVERIFIED_EKS_VERSIONS,
    ExistingEksCluster,
    PlatformConfig,
    SystemNodeGroup,
)

# Installed before the system nodes start (nodes need the CNI to become Ready) ...
NODE_ADDONS = ("vpc-cni", "kube-proxy", "eks-pod-identity-agent")
# ... and after them (CoreDNS pods need somewhere to run before the add-on turns ACTIVE).
SCHEDULED_ADDONS = ("coredns",)
LOGS_POLICY = "CloudWatchAgentServerPolicy"
NODE_POLICIES = (
    "AmazonEKSWorkerNodePolicy",
    "AmazonEC2ContainerRegistryPullOnly",
    "AmazonEKS_CNI_Policy",
)
CLUSTER_ADMIN = "AmazonEKSClusterAdminPolicy"
# EKS access policies that make a principal an admin of the cluster or of namespaces (EKS User
# Guide, "Review access policy permissions").
ADMIN_ACCESS_POLICIES = (CLUSTER_ADMIN, "AmazonEKSAdminPolicy")
# The service accounts the add-ons' pods run as (their Pod Identity associations).
CONTAINER_LOGS_ACCOUNT = "cloudwatch-agent"
TRAINING_OPERATOR_ACCOUNT = "hp-training-operator-controller-manager"

_LOG_TYPES = [
    eks.ClusterLoggingTypes.API,
    eks.ClusterLoggingTypes.AUDIT,
    eks.ClusterLoggingTypes.AUTHENTICATOR,
    eks.ClusterLoggingTypes.CONTROLLER_MANAGER,
    eks.ClusterLoggingTypes.SCHEDULER,
]


def access_policy_arn(partition: str, policy: str) -> str:
    """An EKS access policy's ARN (AWS's, in no region or account)."""
    return f"arn:{partition}:eks::aws:cluster-access-policy/{policy}"


def _endpoint_access(public_cidrs: list[str]) -> eks.EndpointAccess:
    """Private only, or private and public from `public_cidrs` alone."""
    if not public_cidrs:
        return eks.EndpointAccess.PRIVATE
    return eks.EndpointAccess.PUBLIC_AND_PRIVATE.only_from(*public_cidrs)


@dataclass(frozen=True)
class EksProps:
    """What the deployment's EKS cluster is (its configuration's EKS keys, `eks_props`)."""

    name_prefix: str
    version: str
    public_access_cidrs: tuple[str, ...]
    admin_role_arns: tuple[str, ...]
    system_node_group: SystemNodeGroup
    existing: ExistingEksCluster | None


def eks_props(config: PlatformConfig) -> EksProps:
    return EksProps(
        name_prefix=config.name_prefix, version=config.eks_version,
        public_access_cidrs=tuple(config.eks_public_access_cidrs),
        admin_role_arns=tuple(config.eks_admin_role_arns),
        system_node_group=config.system_node_group, existing=config.existing_eks_cluster,
    )  # fmt: skip


class HyperPodEks(Construct):
    """A new EKS cluster for HyperPod, or an imported one.

    Attributes: `cluster` (ICluster), `cluster_name`, `cluster_arn`, `security_group_id`
    (shared with the HyperPod nodes), `network` (where functions that call the API server run),
    `ready` (what HyperPod must wait for).
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        props: EksProps,
        vpc: ec2.IVpc,
        subnets: ec2.SubnetSelection,
        secrets_key: kms.IKey,
        log_key: kms.IKey,
    ) -> None:
        super().__init__(scope, construct_id)
        self._props = props
        self._log_key = log_key
        self.ready: list[IDependable] = []
        existing = props.existing
        if existing:
            self.cluster: eks.ICluster = eks.Cluster.from_cluster_attributes(
                self,
                "Cluster",
                cluster_name=existing.cluster_name,
                vpc=vpc,
                cluster_security_group_id=existing.security_group_id,
            )
            self.security_group_id = existing.security_group_id
        else:
            cluster = eks.Cluster(
                self,
                "Cluster",
                cluster_name=cluster_name_of(props),
                version=eks.KubernetesVersion.of(props.version),
                vpc=vpc,
                vpc_subnets=[subnets],
                # Private access lets nodes in the private subnets join from inside the VPC
                # (the EKS User Guide's private cluster requirements: "required for nodes to
                # register"; public access "is optional"); the platform's functions use it too
                # (ClusterNetwork). A public endpoint only where operators name addresses for
                # it — IAM-authenticated either way.
                endpoint_access=_endpoint_access(props.public_access_cidrs),
                # Auto Mode off: HyperPod brings its own nodes.
                default_capacity_type=eks.DefaultCapacityType.NODEGROUP,
                default_capacity=0,
                bootstrap_self_managed_addons=False,
                cluster_logging=_LOG_TYPES,
                secrets_encryption_key=secrets_key,
            )
            # The control plane's audit trail: kept a year, as the VPC's flow logs are.
            service_log_group(
                self, "ControlPlaneLogs", name=eks_control_plane_group(cluster_name_of(props)),
                key=log_key, retention=logs.RetentionDays.ONE_YEAR, before=cluster,
            )  # fmt: skip
            # Access entries only (the L2's mode, API): HyperPod takes API as well as
            # API_AND_CONFIG_MAP (its EKS prerequisites), and nothing here uses the aws-auth
            # ConfigMap, so no one can be let in by editing it.
            if props.public_access_cidrs:
                acknowledge(
                    cluster,
                    "AwsSolutions-EKS1",
                    "The operator configured a public endpoint (eks_public_access_cidrs) for "
                    "kubectl from those CIDR blocks only; nodes and the platform's functions use "
                    "the private one. Every request is IAM-authenticated (access entries only).",
                )
            if any(ipaddress.IPv4Network(c).prefixlen == 0 for c in props.public_access_cidrs):
                Annotations.of(cluster).add_warning_v2(
                    "nova-mtrl:eks-endpoint-open",
                    "eks_public_access_cidrs admits the whole internet to the EKS API's public "
                    "endpoint (IAM-authenticated still): name your operators' addresses instead, "
                    "or none for a private endpoint only",
                )
            acknowledge_managed_policy(
                cluster.role, "AmazonEKSClusterPolicy",
                "The EKS service role must carry the AWS-maintained AmazonEKSClusterPolicy; EKS "
                "keeps it in step with the control plane.",
            )  # fmt: skip
            if props.version in UNVERIFIED_EKS_VERSIONS:
                Annotations.of(cluster).add_warning_v2(
                    "nova-mtrl:eks-version-unverified",
                    f"Kubernetes {props.version}: AWS's HyperPod EKS prerequisites list "
                    "versions up to 1.34; this one is accepted but unverified with HyperPod.",
                )
            self.cluster = cluster
            self.security_group_id = cluster.cluster_security_group_id
            self.ready = self._add_nodes_and_addons(cluster, subnets)
        self.cluster_name = self.cluster.cluster_name
        self.cluster_arn = self.cluster.cluster_arn
        self.network = ClusterNetwork(
            vpc=vpc,
            subnets=subnets,
            security_group=ec2.SecurityGroup.from_security_group_id(
                self, "ClusterSecurityGroup", self.security_group_id
            ),
        )
        for index, role_arn in enumerate(props.admin_role_arns):
            self.grant_access(
                f"Admin{index}",
                principal_arn=role_arn,
                policy=CLUSTER_ADMIN,
            )

    def grant_access(
        self,
        construct_id: str,
        *,
        principal_arn: str,
        policy: str,
        namespaces: list[str] | None = None,
    ) -> eks.AccessEntry:
        """An access entry for `principal_arn` with one EKS access policy, cluster- or namespace-wide."""
        scope = eks.AccessScopeType.NAMESPACE if namespaces else eks.AccessScopeType.CLUSTER
        return eks.AccessEntry(
            self,
            construct_id,
            cluster=self.cluster,
            principal=principal_arn,
            access_policies=[
                eks.AccessPolicy.from_access_policy_name(
                    policy, access_scope_type=scope, namespaces=namespaces
                )
            ],
        )

    def _add_nodes_and_addons(
        self, cluster: eks.Cluster, subnets: ec2.SubnetSelection
    ) -> list[IDependable]:
        system = self._props.system_node_group
        node_role = iam.Role(
            self,
            "SystemNodeRole",
            assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"),
            description="System node group of the HyperPod EKS cluster (CoreDNS, operators)",
            managed_policies=[
                iam.ManagedPolicy.from_aws_managed_policy_name(name) for name in NODE_POLICIES
            ],
        )
        for name in NODE_POLICIES:
            acknowledge_managed_policy(
                node_role, name,
                "The AWS-maintained EKS node policies: the kubelet joins its cluster, the nodes "
                "pull images (nothing else), the VPC CNI manages their network interfaces; AWS "
                "keeps them current with EKS.",
            )  # fmt: skip
        node_addons = [self._addon(cluster, name) for name in NODE_ADDONS]
        nodegroup = cluster.add_nodegroup_capacity(
            "System",
            nodegroup_name=f"{self._props.name_prefix}-system",
            instance_types=[ec2.InstanceType(system.instance_type)],
            min_size=system.min_size,
            desired_size=system.desired_size,
            max_size=system.max_size,
            subnets=subnets,
            node_role=node_role,
            labels={"nova-mtrl/role": "system"},
        )
        for addon in node_addons:
            nodegroup.node.add_dependency(addon)
        scheduled = [self._addon(cluster, name) for name in SCHEDULED_ADDONS]
        for addon in scheduled:
            addon.node.add_dependency(nodegroup)
        return [*node_addons, nodegroup, *scheduled]

    def _addon(self, cluster: eks.Cluster, name: str) -> eks.Addon:
        return eks.Addon(self, f"Addon-{name}", cluster=cluster, addon_name=name)

    def add_container_logs(self) -> None:
        """Pod logs to CloudWatch (domain/service_logs.pod_log_group): where `mtrl logs --plane
        trainer` reads a run's vLLM and trainer lines; the add-on's groups are made first."""
        role = pod_identity_role(
            self,
            "ContainerLogsRole",
            description="CloudWatch agent and Fluent Bit of the EKS cluster (EKS Pod Identity)",
            cluster_name=self.cluster_name,
            service_account=CONTAINER_LOGS_ACCOUNT,
            managed_policies=[iam.ManagedPolicy.from_aws_managed_policy_name(LOGS_POLICY)],
        )
        acknowledge_managed_policy(
            role,
            LOGS_POLICY,
            "The AWS-maintained policy of the CloudWatch observability add-on: it writes the "
            "cluster's container logs and metrics, and AWS keeps it in step with the agent.",
        )
        addon = self._pod_identity_addon(
            "Addon-cloudwatch-observability",
            "amazon-cloudwatch-observability",
            service_account=CONTAINER_LOGS_ACCOUNT,
            role=role,
        )
        for dependency in self.ready:
            addon.node.add_dependency(dependency)
        for kind in EKS_CONTAINER_INSIGHTS:
            service_log_group(
                self, f"ContainerInsights-{kind}",
                name=eks_container_insights_group(cluster_name_of(self._props), kind),
                key=self._log_key,
                before=addon,
            )  # fmt: skip

    def add_training_operator(self, *, hyperpod_cluster_arn: str, after: IDependable) -> None:
        """The HyperPod training operator add-on (needs cert-manager and an existing HyperPod cluster)."""
        cert_manager = eks.Addon(
            self, "Addon-cert-manager", cluster=self.cluster, addon_name="cert-manager"
        )
        cert_manager.node.add_dependency(after)
        role = pod_identity_role(
            self,
            "TrainingOperatorRole",
            description="HyperPod training operator (EKS Pod Identity)",
            cluster_name=self.cluster_name,
            service_account=TRAINING_OPERATOR_ACCOUNT,
        )
        role.add_to_policy(
            iam.PolicyStatement(
                actions=["sagemaker:DescribeClusterNode"],
                resources=[hyperpod_cluster_arn],
            )
        )
        operator = self._pod_identity_addon(
            "Addon-training-operator",
            "amazon-sagemaker-hyperpod-training-operator",
            service_account=TRAINING_OPERATOR_ACCOUNT,
            role=role,
        )
        operator.node.add_dependency(cert_manager)
        operator.node.add_dependency(after)

    def _pod_identity_addon(
        self, construct_id: str, addon_name: str, *, service_account: str, role: iam.IRole
    ) -> eks.CfnAddon:
        """An add-on whose service account gets `role` through EKS Pod Identity."""
        return eks.CfnAddon(
            self,
            construct_id,
            cluster_name=self.cluster.cluster_name,
            addon_name=addon_name,
            pod_identity_associations=[
                eks.CfnAddon.PodIdentityAssociationProperty(
                    role_arn=role.role_arn, service_account=service_account
                )
            ],
        )


def pod_identity_role(
    scope: Construct,
    construct_id: str,
    *,
    description: str,
    cluster_name: str,
    service_account: str,
    namespace: str | None = None,
    managed_policies: list[iam.IManagedPolicy] | None = None,
) -> iam.Role:
    """A role pods assume through EKS Pod Identity, for this cluster's `service_account` only
    (in `namespace`, a pattern, where given). Pod Identity tags the session it assumes the role
    with the cluster, namespace and service account (EKS User Guide, "Create IAM role with trust
    policy required by EKS Pod Identity", and its session tags), so the trust policy admits no
    association of another cluster, namespace or service account of the account."""
    tags = {"aws:RequestTag/eks-cluster-name": cluster_name,
            "aws:RequestTag/kubernetes-service-account": service_account}  # fmt: skip
    conditions: dict[str, Any] = {"StringEquals": tags}
    if namespace is not None:
        conditions["StringLike"] = {"aws:RequestTag/kubernetes-namespace": namespace}
    principal = iam.ServicePrincipal("pods.eks.amazonaws.com").with_conditions(conditions)
    return iam.Role(
        scope,
        construct_id,
        assumed_by=principal.with_session_tags(),
        description=description,
        managed_policies=managed_policies,
    )


def eks_cluster_name(config: PlatformConfig) -> str:
    return cluster_name_of(eks_props(config))


def cluster_name_of(props: EksProps) -> str:
    return props.existing.cluster_name if props.existing else f"{props.name_prefix}-eks"
