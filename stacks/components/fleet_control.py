"""What the pipeline needs to run a reward fleet per run on ECS (lambdas/pipeline/ecs_fleet.py).

- `environment`: where the fleet lives (cluster, base task definition, subnets, security
  group, log and token prefixes), for the functions that start, watch and stop it;
- `grant_control(function)`: per-run services, task definitions, log groups, token
  parameters and backlog scaling — each scoped to the deployment's names where IAM allows;
- the workers' own access: the task role reads the run queues and reports to their dead-letter
  queue; the execution role reads the run token parameter and writes the per-run log groups.
"""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import ArnFormat, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from constructs import Construct

from lambdas.router.run_queues import deployment_prefix
from stacks.components.nag import acknowledge_key_grant, acknowledge_resource
from stacks.components.reward_fleet import RewardFleet, cluster_name, log_group_name, task_family
from stacks.components.router import run_queue_access
from stacks.config import PlatformConfig


class RewardFleetControl(Construct):
    """Attributes: `environment`."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: PlatformConfig,
        reward_fleet: RewardFleet,
        data_key: kms.IKey,
        run_queue_arns: str,
    ) -> None:
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        prefix = config.name_prefix
        self._fleet = reward_fleet
        self._data_key = data_key
        # Names from the configuration, not references: nothing here depends on the compute
        # stack's exports but the subnets, the security group and the roles.
        log_prefix, family, cluster = (
            log_group_name(config),
            task_family(config),
            cluster_name(config),
        )
        self.environment = {
            "WORKER_CLUSTER": cluster,
            "WORKER_TASK_DEFINITION": family,
            "WORKER_SUBNETS": cdk.Fn.join(",", reward_fleet.subnet_ids),
            "WORKER_SECURITY_GROUP": reward_fleet.security_group.security_group_id,
            "WORKER_LOG_GROUP_PREFIX": log_prefix,
            "RUN_TOKEN_PARAMETER_PREFIX": f"/{prefix}/runs",
        }
        self._services = stack.format_arn(
            service="ecs",
            resource="service",
            resource_name=f"{cluster}/{deployment_prefix(prefix)}*",
        )
        self._task_definitions = stack.format_arn(
            service="ecs",
            resource="task-definition",
            resource_name=f"{family}-*",
            arn_format=ArnFormat.SLASH_RESOURCE_NAME,
        )
        self._parameters = stack.format_arn(
            service="ssm", resource="parameter", resource_name=f"{prefix}/runs/*"
        )
        self._run_log_groups = stack.format_arn(
            service="logs",
            resource="log-group",
            resource_name=f"{log_prefix}/*",
            arn_format=ArnFormat.COLON_RESOURCE_NAME,
        )
        self._scalable_targets = stack.format_arn(
            service="application-autoscaling", resource="scalable-target", resource_name="*"
        )
        # Target tracking makes (and removes) its alarms with the caller's rights (ECS Developer
        # Guide, "IAM permissions required for Amazon ECS service auto scaling"); they are named
        # `TargetTracking-<scalable target's resource id>-…`.
        self._scaling_alarms = stack.format_arn(
            service="cloudwatch",
            resource="alarm",
            resource_name=f"TargetTracking-service/{cluster}/{deployment_prefix(prefix)}*",
            arn_format=ArnFormat.COLON_RESOURCE_NAME,
        )
        self._autoscaling_role = stack.format_arn(
            service="iam",
            region="",
            resource="role",
            resource_name="aws-service-role/ecs.application-autoscaling.amazonaws.com/*",
        )
        self._grant_workers(run_queue_arns)

    def _grant_workers(self, run_queue_arns: str) -> None:
        # The roles live in the compute stack; the grants that name run-time things live here.
        task_role = iam.Role.from_role_arn(
            self, "TaskRole", self._fleet.task_role.role_arn, mutable=True
        )
        execution_role = iam.Role.from_role_arn(
            self,
            "ExecutionRole",
            self._fleet.task_definition.obtain_execution_role().role_arn,
            mutable=True,
        )
        worker_access = iam.Policy(
            self,
            "WorkerRunAccess",
            roles=[task_role],
            statements=[
                run_queue_access(run_queue_arns, send=True),
                iam.PolicyStatement(
                    actions=["kms:Decrypt", "kms:GenerateDataKey"],
                    resources=[self._data_key.key_arn],
                ),
            ],
        )
        startup = iam.Policy(
            self,
            "WorkerStartup",
            roles=[execution_role],
            statements=[
                iam.PolicyStatement(actions=["ssm:GetParameters"], resources=[self._parameters]),
                iam.PolicyStatement(actions=["kms:Decrypt"], resources=[self._data_key.key_arn]),
                iam.PolicyStatement(
                    actions=["logs:CreateLogStream", "logs:PutLogEvents"],
                    resources=[f"{self._run_log_groups}:*"],
                ),
            ],
        )
        for policy, resource, reason in (
            (worker_access, run_queue_arns, "Per-run queues are created at run time; names share the deployment prefix."),
            (startup, self._parameters, "Each run's token parameter is made at run time under the deployment's /runs path."),
            (startup, f"{self._run_log_groups}:*", "Each run's worker log group is made at run time under the fleet's log prefix."),
        ):  # fmt: skip
            acknowledge_resource(policy, "AwsSolutions-IAM5", resource, reason)

    def grant_control(self, function: iam.IGrantable) -> None:
        """Start, watch and stop per-run fleets."""
        fleet = self._fleet
        statements = [
            iam.PolicyStatement(
                actions=[
                    "ecs:CreateService",
                    "ecs:DescribeServices",
                    "ecs:UpdateService",
                    "ecs:DeleteService",
                    "ecs:TagResource",
                ],
                resources=[self._services, f"{self._task_definitions}:*"],
            ),
            iam.PolicyStatement(
                actions=["ecs:RegisterTaskDefinition"], resources=[f"{self._task_definitions}:*"]
            ),
            # Task definitions: reading and deregistering take no resource ARN.
            iam.PolicyStatement(
                actions=[
                    "ecs:DescribeTaskDefinition",
                    "ecs:DeregisterTaskDefinition",
                    "ecs:ListTaskDefinitions",
                    "application-autoscaling:DescribeScalableTargets",
                ],
                resources=["*"],
            ),
            iam.PolicyStatement(
                actions=["iam:PassRole"],
                resources=[
                    fleet.task_role.role_arn,
                    fleet.task_definition.obtain_execution_role().role_arn,
                ],
                conditions={"StringEquals": {"iam:PassedToService": "ecs-tasks.amazonaws.com"}},
            ),
            iam.PolicyStatement(
                actions=["ssm:PutParameter", "ssm:GetParameter", "ssm:DeleteParameter"],
                resources=[self._parameters],
            ),
            iam.PolicyStatement(
                actions=["logs:CreateLogGroup", "logs:PutRetentionPolicy", "logs:TagResource"],
                resources=[self._run_log_groups],
            ),
            iam.PolicyStatement(
                actions=[
                    "application-autoscaling:RegisterScalableTarget",
                    "application-autoscaling:DeregisterScalableTarget",
                    "application-autoscaling:PutScalingPolicy",
                ],
                resources=[self._scalable_targets],
            ),
            iam.PolicyStatement(
                actions=[
                    "cloudwatch:PutMetricAlarm",
                    "cloudwatch:DescribeAlarms",
                    "cloudwatch:DeleteAlarms",
                ],
                resources=[self._scaling_alarms],
            ),
            iam.PolicyStatement(
                actions=["iam:CreateServiceLinkedRole"],
                resources=[self._autoscaling_role],
                conditions={
                    "StringLike": {
                        "iam:AWSServiceName": "ecs.application-autoscaling.amazonaws.com"
                    }
                },
            ),
        ]
        for statement in statements:
            function.grant_principal.add_to_principal_policy(statement)
        self._data_key.grant_encrypt_decrypt(function)  # the token parameter is a SecureString
        role = function.grant_principal
        for resource, reason in {
            self._services: "Per-run ECS services are named at run time under the deployment prefix.",
            f"{self._task_definitions}:*": "Per-run task definition families are named at run time after the base family.",
            "*": "ECS task definition description, listing and deregistration and scalable-target description take no resource ARN.",
            self._parameters: "Each run's token parameter is made at run time under the deployment's /runs path.",
            self._run_log_groups: "Each run's worker log group is made at run time under the fleet's log prefix.",
            self._scalable_targets: "Scalable target ARNs are ids Application Auto Scaling makes at run time.",
            self._scaling_alarms: "Target tracking names its alarms after each run's service, made at run time.",
            self._autoscaling_role: "Only ECS's Application Auto Scaling service-linked role, created once by AWS.",
        }.items():  # fmt: skip
            acknowledge_resource(role, "AwsSolutions-IAM5", resource, reason)
        acknowledge_key_grant(role, "the SecureString run token parameters")
