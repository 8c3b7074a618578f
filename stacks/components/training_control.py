"""What the pipeline needs to run a training job per run on HyperPod
(lambdas/pipeline/hyperpod_training.py).

- `environment`: the clusters, the instance group, the job kind, the model presets and the
  keep-warm period, for the functions that scale, submit, watch and release;
- the needs NODES_SCALE (DescribeCluster / UpdateCluster on the HyperPod cluster, PassRole of
  its execution role to SageMaker only), NODES_COUNT (ListClusterNodes), KUBERNETES
  (DescribeCluster on the EKS cluster and an access entry in the pipeline's Kubernetes group,
  whose rights the deploy-time RBAC below spells out and fences into run namespaces,
  domain/kubernetes_rbac.py), POD_IDENTITY_CREATE / _DELETE (stacks/components/access.py),
  HUB_TOKENS_READ (GetSecretValue on the secrets the model presets name for gated models);
- `job_role`: a run's pods' role, given to them per run by an EKS Pod Identity association
  (its needs are declared with the others).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from aws_cdk import ArnFormat, CustomResource, Duration, Stack
from aws_cdk import aws_eks as eks
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from constructs import Construct

from domain.kubernetes_rbac import launcher_group, pipeline_group, rbac_properties
from domain.naming import RUN_SERVICE_ACCOUNT, run_prefix
from domain.needs import Need
from domain.nova_job import FORGE_RECIPE_PATHS, FORGE_RECIPE_SOURCE
from domain.presets import JobKind, ModelPreset
from domain.service_logs import pod_log_group
from lambdas.environment import environment_for
from lambdas.kubernetes.settings import RbacSettings
from lambdas.pipeline.hyperpod_training import HyperPodSettings
from lambdas.pipeline.nova_training import NovaSettings
from stacks.components.access import Allow, grant_log_reading, log_group_arn
from stacks.components.capacity_leases import CapacityLeaseTable
from stacks.components.eks import (
    ADMIN_ACCESS_POLICIES,
    CLUSTER_ADMIN,
    access_policy_arn,
    eks_cluster_name,
    pod_identity_role,
)
from stacks.components.functions import CUSTOM_RESOURCE, ClusterNetwork, pipeline_function
from stacks.components.hyperpod import hyperpod_cluster_name
from stacks.components.nag import Wildcard, acknowledge_resource
from stacks.components.nova_launcher import NovaLauncher
from stacks.config import ForgeCliBundle, HyperPodInstanceGroup, PlatformConfig


@dataclass(frozen=True)
class TrainingControlProps:
    """What the training planes' controls need of the deployment (`training_control_props`)."""

    name_prefix: str
    eks_cluster: str
    hyperpod_cluster: str
    existing_hyperpod: bool  # an existing cluster's ARN ends in an id SageMaker gave it
    presets: Mapping[str, ModelPreset]
    training_group: HyperPodInstanceGroup
    nova_group: HyperPodInstanceGroup | None
    job_kind: JobKind
    keep_warm_minutes: int
    forge_cli: ForgeCliBundle | None


def training_control_props(config: PlatformConfig) -> TrainingControlProps:
    return TrainingControlProps(
        name_prefix=config.name_prefix, eks_cluster=eks_cluster_name(config),
        hyperpod_cluster=hyperpod_cluster_name(config),
        existing_hyperpod=config.existing_hyperpod_cluster is not None,
        presets=config.model_presets, training_group=config.training_group,
        nova_group=config.nova_group, job_kind=config.training_job_kind,
        keep_warm_minutes=config.keep_warm_minutes, forge_cli=config.forge_cli_bundle,
    )  # fmt: skip


class TrainingClusterControl(Construct):
    """Attributes: `environment`, `job_role`, `rbac`, `leases` (which runs hold the training
    group: a CapacityLeaseTable); provides the training plane's needs."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        props: TrainingControlProps,
        code: lambda_.Code,
        hyperpod_cluster_arn: str,
        execution_role_arn: str | None,
        restricted_execution_role_arn: str | None,
        cluster_network: ClusterNetwork,
        data_key: kms.IKey,
        trainer_image_uri: str | None = None,
    ) -> None:
        """`trainer_image_uri`: the image `cdk deploy` built for presets that name none."""
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        self._props, self._data_key = props, data_key
        self._eks_name = props.eks_cluster
        self._eks_arn = stack.format_arn(
            service="eks", resource="cluster", resource_name=self._eks_name
        )
        self._hyperpod_arn = hyperpod_cluster_arn
        self._execution_role_arn = execution_role_arn
        self._restricted_role_arn = restricted_execution_role_arn
        self._entries = 0
        self.job_role = self._job_role()
        self.leases = CapacityLeaseTable(self, "CapacityLeases", data_key=data_key)
        self._associations = stack.format_arn(
            service="eks",
            resource="podidentityassociation",
            resource_name=f"{self._eks_name}/*",
        )
        # Pod Identity association ids are made by EKS per run: only this cluster's.
        wildcards = {self._associations: Wildcard.ASSIGNED_BY_AWS}
        if props.existing_hyperpod:
            # An existing cluster's ARN ends in the id SageMaker gave it, not its name.
            wildcards[hyperpod_cluster_arn] = Wildcard.ASSIGNED_BY_AWS
        # Secrets Manager ends a secret's ARN in "-" and six random characters (botocore's
        # model, CreateSecret `Name`): each secret a preset names, whatever they are.
        names = sorted({p.hub_token_secret for p in props.presets.values()} - {None})
        self._hub_token_secrets = [
            stack.format_arn(
                service="secretsmanager",
                resource="secret",
                resource_name=f"{name}-??????",
                arn_format=ArnFormat.COLON_RESOURCE_NAME,
            )
            for name in names
        ]
        wildcards |= dict.fromkeys(self._hub_token_secrets, Wildcard.ASSIGNED_BY_AWS)
        self._allow = Allow(wildcards)
        self.environment = environment_for(
            HyperPodSettings,
            eks_cluster=self._eks_name,
            hyperpod_cluster=props.hyperpod_cluster,
            leases_table=self.leases.table.table_name,
            instance_group=props.training_group.name,
            instance_type=props.training_group.instance_type,
            job_kind=props.job_kind,
            presets=json.dumps(
                {
                    name: {
                        **preset.model_dump(mode="json"),
                        "trainer_image": preset.trainer_image or trainer_image_uri,
                    }
                    for name, preset in props.presets.items()
                },
                sort_keys=True,
            ),
            account=stack.account,
            keep_warm_seconds=props.keep_warm_minutes * 60,
            job_role_arn=self.job_role.role_arn,
        )
        self.launcher = self._nova_plane(cluster_network)
        self.rbac = self._bootstrap_rbac(code, cluster_network)

    provides = frozenset(
        {
            Need.NODES_SCALE,
            Need.NODES_COUNT,
            Need.KUBERNETES,
            Need.POD_IDENTITY_CREATE,
            Need.POD_IDENTITY_DELETE,
            Need.TRAINER_LOGS_READ,
            Need.CLUSTERS_CHECK,
            Need.HUB_TOKENS_READ,
            Need.NOVA_LAUNCH,
            Need.FORGE_RECIPES_READ,
            Need.NOVA_CHART,
        }
    )

    def _nova_plane(self, network: ClusterNetwork) -> NovaLauncher | None:
        """With a restricted group: the launcher function, and the Nova plane's settings for the
        functions (lambdas/pipeline/nova_training.py); without one the Nova needs grant nothing."""
        group = self._props.nova_group
        if group is None:
            return None
        launcher = NovaLauncher(
            self, "NovaLauncher", eks_cluster=self._eks_name,
            hyperpod_cluster=self._props.hyperpod_cluster, network=network,
            log_key=self._data_key, forge_cli=self._props.forge_cli,
        )  # fmt: skip
        self.environment |= environment_for(
            NovaSettings,
            instance_group=group.name,
            instance_type=group.instance_type,
            launcher=launcher.function.function_name,
        )
        return launcher

    def grant(self, need: Need, role: iam.IRole) -> None:
        if need in (Need.NOVA_LAUNCH, Need.FORGE_RECIPES_READ, Need.NOVA_CHART):
            self._grant_nova(need, role)
            return
        match need:
            case Need.NODES_SCALE:
                # UpdateCluster, and what the Service Authorization Reference lists as its
                # dependent actions for an EKS-orchestrated cluster whose images stay as they
                # are: node changes, the EKS cluster, and the access entry HyperPod keeps for
                # the instance groups' execution role (ClusterMetadata.EksRoleAccessEntries).
                cluster_actions = [
                    "sagemaker:DescribeCluster",
                    "sagemaker:UpdateCluster",
                    "sagemaker:BatchAddClusterNodes",
                    "sagemaker:BatchDeleteClusterNodes",
                ]
                self._allow(role, cluster_actions, self._hyperpod_arn)
                self._allow(role, ["eks:DescribeCluster"], self._eks_arn)
                # UpdateCluster hands every instance group's execution role back to SageMaker,
                # restricted groups' too, and HyperPod keeps an access entry for each.
                execution_roles = [
                    arn for arn in (self._execution_role_arn, self._restricted_role_arn) if arn
                ]
                for arn in execution_roles:
                    self._pass(role, arn, "sagemaker.amazonaws.com")
                if execution_roles:
                    self._execution_role_entries(role, execution_roles)
            case Need.NODES_COUNT:
                self._allow(role, ["sagemaker:ListClusterNodes"], self._hyperpod_arn)
            case Need.KUBERNETES:
                self._allow(role, ["eks:DescribeCluster"], self._eks_arn)
                self._access_entry(role.role_arn, groups=[pipeline_group(self._props.name_prefix)])
            case Need.POD_IDENTITY_CREATE:
                self._allow(
                    role,
                    ["eks:ListPodIdentityAssociations", "eks:CreatePodIdentityAssociation"],
                    self._eks_arn,
                )
                # The association is tagged with its run on creation.
                self._allow(role, ["eks:TagResource"], self._associations)
                self._pass(role, self.job_role.role_arn, "pods.eks.amazonaws.com")
            case Need.HUB_TOKENS_READ:
                for secret in self._hub_token_secrets:
                    self._allow(role, ["secretsmanager:GetSecretValue"], secret)
            case Need.TRAINER_LOGS_READ:
                grant_log_reading(
                    role, log_group_arn(Stack.of(self), pod_log_group(self._eks_name))
                )
            case Need.CLUSTERS_CHECK:
                self._allow(role, ["eks:DescribeCluster"], self._eks_arn)
                self._allow(role, ["sagemaker:DescribeCluster"], self._hyperpod_arn)
                # Quotas have no resource type (Service Authorization Reference).
                self._allow(
                    role,
                    [
                        "servicequotas:ListServiceQuotas",
                        "servicequotas:ListAWSDefaultServiceQuotas",
                    ],
                    "*",
                )
            case Need.POD_IDENTITY_DELETE:
                self._allow(role, ["eks:ListPodIdentityAssociations"], self._eks_arn)
                self._allow(role, ["eks:DeletePodIdentityAssociation"], self._associations)

    def _grant_nova(self, need: Need, role: iam.IRole) -> None:
        if self.launcher is None:
            return  # no restricted group: no Nova plane to reach
        match need:
            case Need.NOVA_LAUNCH:
                self._allow(role, ["lambda:InvokeFunction"], self.launcher.function.function_arn)
            case Need.FORGE_RECIPES_READ:
                # The Forge recipes a run may use (training, evaluation), each named (domain/nova_job.py), read-only.
                partition = Stack.of(self).partition
                recipes = [
                    f"arn:{partition}:s3:::"
                    + FORGE_RECIPE_SOURCE.format(recipe=path).removeprefix("s3://")
                    for path in sorted(FORGE_RECIPE_PATHS)
                ]
                self._allow(role, ["s3:GetObject"], *recipes)
            case Need.NOVA_CHART:
                self._allow(role, ["eks:DescribeCluster"], self._eks_arn)
                # The cluster context the HyperPod CLI reads (connect-cluster's DescribeCluster).
                self._allow(role, ["sagemaker:DescribeCluster"], self._hyperpod_arn)
                self._access_entry(role.role_arn, groups=[launcher_group(self._props.name_prefix)])

    def _execution_role_entries(self, role: iam.IRole, execution_role_arns: list[str]) -> None:
        """The EKS access entries of the execution roles only: made, read, given their access
        policy or removed by HyperPod with the caller's rights, for those principals and no
        other (`eks:principalArn`, a condition key of each of these actions)."""
        stack = Stack.of(self)
        entries = stack.format_arn(
            service="eks",
            resource="access-entry",
            resource_name=f"{self._eks_name}/role/{stack.account}/*",
        )
        only_it = {"StringEquals": {"eks:principalArn": execution_role_arns}}
        role.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["eks:CreateAccessEntry"], resources=[self._eks_arn], conditions=only_it
            )
        )
        role.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["eks:DescribeAccessEntry", "eks:DeleteAccessEntry"],
                resources=[entries],
                conditions=only_it,
            )
        )
        # Never an admin access policy: whatever HyperPod associates to its execution roles (not
        # published), it is not a node role made cluster or namespace admin.
        admin_policies = [access_policy_arn(stack.partition, p) for p in ADMIN_ACCESS_POLICIES]
        role.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["eks:AssociateAccessPolicy"],
                resources=[entries],
                conditions={**only_it, "ArnNotLike": {"eks:policyArn": admin_policies}},
            )
        )
        # An access entry's ARN ends in an id EKS assigns; the eks:principalArn condition keeps
        # it to the HyperPod execution roles' entries on this cluster.
        acknowledge_resource(role, entries, Wildcard.ASSIGNED_BY_AWS)

    def _pass(self, role: iam.IRole, passed: str, service: str) -> None:
        self._allow(
            role,
            ["iam:PassRole"],
            passed,
            conditions={"StringEquals": {"iam:PassedToService": service}},
        )

    def _job_role(self) -> iam.Role:
        return pod_identity_role(
            self,
            "JobRole",
            description="A run's vLLM and trainer pods: its queues, its dataset, its outputs",
            cluster_name=self._eks_name,
            service_account=RUN_SERVICE_ACCOUNT,
            namespace=f"{run_prefix(self._props.name_prefix)}*",
        )

    def _access_entry(
        self, principal_arn: str, *, groups: list[str] | None = None, admin: bool = False
    ) -> eks.CfnAccessEntry:
        self._entries += 1
        entry = eks.CfnAccessEntry(
            self,
            f"AccessEntry{self._entries}",
            cluster_name=self._eks_name,
            principal_arn=principal_arn,
            type="STANDARD",
            kubernetes_groups=groups,
            access_policies=[
                eks.CfnAccessEntry.AccessPolicyProperty(
                    policy_arn=access_policy_arn(Stack.of(self).partition, CLUSTER_ADMIN),
                    access_scope=eks.CfnAccessEntry.AccessScopeProperty(type="cluster"),
                )
            ]
            if admin
            else None,
        )
        return entry

    def _bootstrap_rbac(self, code: lambda_.Code, network: ClusterNetwork) -> CustomResource:
        """Applies the pipeline's RBAC at deploy time. Its role is the one cluster admin here:
        creating RBAC needs the rights it grants; only CloudFormation invokes it."""
        function = pipeline_function(
            self,
            "RbacBootstrap",
            handler="lambdas.kubernetes.bootstrap.on_event",
            description="Applies the pipeline's Kubernetes RBAC at deploy time (custom resource)",
            code=code,
            timeout=Duration.minutes(2),
            environment=environment_for(
                RbacSettings, prefix=self._props.name_prefix, eks_cluster=self._eks_name
            ),
            network=network,
            log_key=self._data_key,
            invocation=CUSTOM_RESOURCE,
        )
        function.add_to_role_policy(
            iam.PolicyStatement(actions=["eks:DescribeCluster"], resources=[self._eks_arn])
        )
        entry = self._access_entry(function.role.role_arn, admin=True)  # type: ignore[union-attr]
        resource = CustomResource(
            self,
            "PipelineRbac",
            service_token=function.function_arn,
            resource_type="Custom::KubernetesRbac",
            # The function builds the objects itself; a new revision of them (a new digest)
            # re-applies them on the next deploy.
            properties=rbac_properties(
                self._props.name_prefix, nova_launcher=self.launcher is not None
            ),
        )
        resource.node.add_dependency(entry)
        return resource
