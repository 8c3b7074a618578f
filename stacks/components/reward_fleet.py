"""The ECS (Fargate) cluster and task definition of the reward workers."""

from __future__ import annotations

from aws_cdk import RemovalPolicy
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from constructs import Construct

from domain.naming import WORKER_CONTAINER
from domain.service_logs import ecs_container_insights_group
from stacks.components.log_groups import service_log_group
from stacks.components.nag import acknowledge_no_resource_type
from stacks.components.project_files import project_image

WORKER_DOCKERFILE = "reward_envs/Dockerfile"
# The image's build context: what reward_envs/Dockerfile copies and nothing else.
BUILD_CONTEXT = ("domain", "reward_envs")


def cluster_name(name_prefix: str) -> str:
    return f"{name_prefix}-reward-workers"


def log_group_name(name_prefix: str) -> str:
    """The workers' log group; each run's own groups are named below it."""
    return f"/{name_prefix}/reward-workers"


def task_family(name_prefix: str) -> str:
    return f"{name_prefix}-reward-worker"


class RewardFleet(Construct):
    """ECS cluster (Container Insights) and the reward-worker Fargate task definition.

    The image is a Docker asset: built by `cdk deploy`, never by `cdk synth`. Per-run workers
    are started from this task definition by the pipeline.

    Attributes: `cluster`, `task_definition`, `task_role`, `security_group`, `log_group`,
    `subnet_ids` (the private subnets workers run in).
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        name_prefix: str,
        cpu: int,
        memory_mib: int,
        vpc: ec2.IVpc,
        log_key: kms.IKey,
    ) -> None:
        super().__init__(scope, construct_id)
        self.subnet_ids = [subnet.subnet_id for subnet in vpc.private_subnets]
        self.cluster = ecs.Cluster(
            self,
            "Cluster",
            cluster_name=cluster_name(name_prefix),
            vpc=vpc,
            container_insights_v2=ecs.ContainerInsights.ENABLED,
        )
        service_log_group(
            self, "ContainerInsights", name=ecs_container_insights_group(cluster_name(name_prefix)),
            key=log_key, before=self.cluster,
        )  # fmt: skip
        self.security_group = ec2.SecurityGroup(
            self,
            "WorkerSecurityGroup",
            vpc=vpc,
            description="Reward workers: no inbound, outbound HTTPS to AWS APIs",
            allow_all_outbound=False,
        )
        self.security_group.add_egress_rule(
            ec2.Peer.any_ipv4(), ec2.Port.tcp(443), "AWS APIs (SQS, Lambda URL, logs) and images"
        )
        self.log_group = logs.LogGroup(
            self,
            "Logs",
            log_group_name=log_group_name(name_prefix),
            retention=logs.RetentionDays.THREE_MONTHS,
            removal_policy=RemovalPolicy.DESTROY,
            encryption_key=log_key,
        )
        self.task_role = iam.Role(
            self,
            "TaskRole",
            assumed_by=iam.ServicePrincipal("ecs-tasks.amazonaws.com"),
            description="Reward workers: per-run queues and the rollout proxy, granted per run",
        )
        self.task_definition = ecs.FargateTaskDefinition(
            self,
            "TaskDefinition",
            family=task_family(name_prefix),
            cpu=cpu,
            memory_limit_mib=memory_mib,
            task_role=self.task_role,
            runtime_platform=ecs.RuntimePlatform(
                cpu_architecture=ecs.CpuArchitecture.X86_64,
                operating_system_family=ecs.OperatingSystemFamily.LINUX,
            ),
        )
        image = project_image(self, "Image", dockerfile=WORKER_DOCKERFILE, folders=BUILD_CONTEXT)
        self.task_definition.add_container(
            WORKER_CONTAINER,
            image=ecs.ContainerImage.from_docker_image_asset(image),
            essential=True,
            readonly_root_filesystem=True,
            logging=ecs.LogDriver.aws_logs(stream_prefix="worker", log_group=self.log_group),
        )
        execution_role = self.task_definition.obtain_execution_role()
        # ECS adds ecr:GetAuthorizationToken; image pulls are scoped to the asset repository.
        acknowledge_no_resource_type(execution_role)
