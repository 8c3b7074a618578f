"""What the pipeline needs to run a training job per run on HyperPod
(lambdas/pipeline/hyperpod_training.py).

- `environment`: the clusters, the instance group, the job kind, the model presets and the
  keep-warm period, for the functions that scale, submit, watch and release;
- `grant_capacity(function)`: DescribeCluster / UpdateCluster / ListClusterNodes on the
  HyperPod cluster, PassRole of its execution role to SageMaker only, the capacity leases;
- `grant_kubernetes(function)`: DescribeCluster on the EKS cluster and an access entry in the
  pipeline's Kubernetes group, whose rights the deploy-time RBAC below spells out and fences
  into run namespaces (lambdas/kubernetes/rbac.py);
- `job_role`: what a run's pods may do in AWS (its queues, its dataset, its outputs), given to
  them per run by an EKS Pod Identity association — `grant_pod_identity(function)` lets a step
  make and remove those associations.
"""

from __future__ import annotations

import json

from aws_cdk import CustomResource, Duration, Stack
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_eks as eks
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_s3 as s3
from constructs import Construct

from lambdas.kubernetes.rbac import pipeline_group, pipeline_rbac
from mtrl.bucket import RUNS_PREFIX, TRAINING_DATA_PREFIX
from stacks.components.eks import eks_cluster_name, pod_identity_role
from stacks.components.functions import pipeline_function
from stacks.components.hyperpod import hyperpod_cluster_name
from stacks.components.nag import acknowledge_key_grant, acknowledge_resource
from stacks.components.router import run_queue_access
from stacks.config import PlatformConfig

CLUSTER_ADMIN = "AmazonEKSClusterAdminPolicy"


class TrainingClusterControl(Construct):
    """Attributes: `environment`."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: PlatformConfig,
        code: lambda_.Code,
        hyperpod_cluster_arn: str,
        execution_role_arn: str | None,
        runs_table: dynamodb.ITable,
        data_bucket: s3.IBucket,
        data_key: kms.IKey,
        run_queue_arns: str,
    ) -> None:
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        self._config = config
        self._eks_name = eks_cluster_name(config)
        self._eks_arn = stack.format_arn(
            service="eks", resource="cluster", resource_name=self._eks_name
        )
        self._hyperpod_arn = hyperpod_cluster_arn
        self._execution_role_arn = execution_role_arn
        self._runs_table = runs_table
        self._entries = 0
        self.job_role = self._job_role(data_bucket, data_key, run_queue_arns)
        self._associations = stack.format_arn(
            service="eks",
            resource="podidentityassociation",
            resource_name=f"{self._eks_name}/*",
        )
        self.environment = {
            "EKS_CLUSTER": self._eks_name,
            "HYPERPOD_CLUSTER": hyperpod_cluster_name(config),
            "HYPERPOD_INSTANCE_GROUP": config.training_group.name,
            "HYPERPOD_INSTANCE_TYPE": config.training_group.instance_type,
            "TRAINING_JOB_KIND": config.training_job_kind,
            "MODEL_PRESETS": json.dumps(
                {
                    name: preset.model_dump(mode="json")
                    for name, preset in config.model_presets.items()
                },
                sort_keys=True,
            ),
            "ACCOUNT_ID": stack.account,
            "KEEP_WARM_SECONDS": str(config.keep_warm_minutes * 60),
            "TRAINING_JOB_ROLE_ARN": self.job_role.role_arn,
        }
        self.rbac = self._bootstrap_rbac(code)

    def grant_capacity(self, function: lambda_.IFunction) -> None:
        """Scale the training instance group and hold its lease."""
        role = function.role
        assert role is not None
        role.add_to_principal_policy(
            iam.PolicyStatement(
                actions=[
                    "sagemaker:DescribeCluster",
                    "sagemaker:UpdateCluster",
                    "sagemaker:ListClusterNodes",
                ],
                resources=[self._hyperpod_arn],
            )
        )
        if self._execution_role_arn:
            # UpdateCluster hands every instance group's execution role back to SageMaker.
            role.add_to_principal_policy(
                iam.PolicyStatement(
                    actions=["iam:PassRole"],
                    resources=[self._execution_role_arn],
                    conditions={"StringEquals": {"iam:PassedToService": "sagemaker.amazonaws.com"}},
                )
            )
        self._runs_table.grant_read_write_data(role)
        if self._config.existing_hyperpod_cluster:
            acknowledge_resource(
                role,
                "AwsSolutions-IAM5",
                self._hyperpod_arn,
                "An existing HyperPod cluster's ARN ends in an id SageMaker assigned, not its "
                "name; the actions are scoped to clusters of this account and region.",
            )
        acknowledge_key_grant(role, "the runs table and its capacity leases")

    def grant_kubernetes(self, function: lambda_.IFunction) -> None:
        """Reach the EKS API as a member of the pipeline's Kubernetes group."""
        role = function.role
        assert role is not None
        role.add_to_principal_policy(
            iam.PolicyStatement(actions=["eks:DescribeCluster"], resources=[self._eks_arn])
        )
        self._access_entry(role.role_arn, groups=[pipeline_group(self._config.name_prefix)])

    def grant_pod_identity(self, function: lambda_.IFunction) -> None:
        """Make and remove the per-run Pod Identity associations to the job role."""
        role = function.role
        assert role is not None
        for statement in (
            iam.PolicyStatement(
                actions=["eks:CreatePodIdentityAssociation", "eks:ListPodIdentityAssociations"],
                resources=[self._eks_arn],
            ),
            iam.PolicyStatement(
                actions=["eks:DeletePodIdentityAssociation", "eks:TagResource"],
                resources=[self._associations],
            ),
            iam.PolicyStatement(
                actions=["iam:PassRole"],
                resources=[self.job_role.role_arn],
                conditions={"StringEquals": {"iam:PassedToService": "pods.eks.amazonaws.com"}},
            ),
        ):
            role.add_to_principal_policy(statement)
        acknowledge_resource(
            role,
            "AwsSolutions-IAM5",
            self._associations,
            "Pod Identity association ids are made by EKS per run; only this cluster's.",
        )

    def _job_role(self, bucket: s3.IBucket, key: kms.IKey, run_queue_arns: str) -> iam.Role:
        role = pod_identity_role(
            self,
            "JobRole",
            description="A run's vLLM and trainer pods: its queues, its dataset, its outputs",
        )
        role.add_to_policy(run_queue_access(run_queue_arns, send=True))
        datasets = bucket.arn_for_objects(f"{TRAINING_DATA_PREFIX}*")
        outputs = bucket.arn_for_objects(f"{RUNS_PREFIX}*")
        role.add_to_policy(
            iam.PolicyStatement(
                actions=["s3:GetObject", "s3:GetObjectVersion"], resources=[datasets, outputs]
            )
        )
        role.add_to_policy(iam.PolicyStatement(actions=["s3:PutObject"], resources=[outputs]))
        role.add_to_policy(
            iam.PolicyStatement(
                actions=["s3:ListBucket"],
                resources=[bucket.bucket_arn],
                conditions={"StringLike": {"s3:prefix": [f"{RUNS_PREFIX}*"]}},
            )
        )
        key.grant_encrypt_decrypt(role)
        for resource, reason in {
            run_queue_arns: "Per-run queues are created at run time; names share the deployment prefix.",
            datasets: "A run reads the dataset it was started for; datasets live under training-data/.",
            outputs: "A run writes its checkpoints and metrics under runs/<run id>/, made at run time.",
        }.items():  # fmt: skip
            acknowledge_resource(role, "AwsSolutions-IAM5", resource, reason)
        acknowledge_key_grant(role, "the run queues, the dataset and the outputs")
        return role

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
                    policy_arn=f"arn:{Stack.of(self).partition}:eks::aws:cluster-access-policy/{CLUSTER_ADMIN}",
                    access_scope=eks.CfnAccessEntry.AccessScopeProperty(type="cluster"),
                )
            ]
            if admin
            else None,
        )
        return entry

    def _bootstrap_rbac(self, code: lambda_.Code) -> CustomResource:
        """Applies the pipeline's RBAC at deploy time. Its role is the one cluster admin here:
        creating RBAC needs the rights it grants; only CloudFormation invokes it."""
        function = pipeline_function(
            self,
            "RbacBootstrap",
            handler="lambdas.kubernetes.bootstrap.on_event",
            description="Applies the pipeline's Kubernetes RBAC at deploy time (custom resource)",
            code=code,
            timeout=Duration.minutes(2),
            environment={
                "NAME_PREFIX": self._config.name_prefix,
                "EKS_CLUSTER": self._eks_name,
            },
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
            # A new revision of the objects re-applies them on the next deploy.
            properties={
                "Objects": json.dumps(pipeline_rbac(self._config.name_prefix), sort_keys=True)
            },
        )
        resource.node.add_dependency(entry)
        return resource
