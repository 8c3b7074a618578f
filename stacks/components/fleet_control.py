"""What the pipeline needs to run a reward fleet per run on ECS (lambdas/pipeline/ecs_fleet.py).

- `environment`: where the fleet lives (cluster, base task definition, subnets, security
  group, log and token prefixes), for the functions that start, watch and stop it;
- the needs FLEET_START, FLEET_WATCH and FLEET_STOP (stacks/components/access.py): per-run
  services, task definitions, log groups, token parameters and backlog scaling — each scoped to
  the deployment's names where IAM allows;
- `task_role`: the workers' own role (its needs are declared with the others); the execution
  role reads the run token parameter and writes the per-run log groups, for ECS.
"""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import ArnFormat, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from constructs import Construct

from domain.naming import run_prefix
from domain.needs import Need
from lambdas.environment import environment_for
from lambdas.pipeline.ecs_fleet import EcsFleetSettings
from stacks.components.access import Allow, alarm_arn, grant_log_reading, log_group_arn
from stacks.components.nag import Wildcard, acknowledge_resource
from stacks.components.reward_fleet import RewardFleet, cluster_name, log_group_name, task_family


class RewardFleetControl(Construct):
    """Attributes: `environment`, `task_role` (the workers'); provides the fleet's needs."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        name_prefix: str,
        reward_fleet: RewardFleet,
        data_key: kms.IKey,
    ) -> None:
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        prefix = name_prefix
        self._fleet = reward_fleet
        self._data_key = data_key
        # Names from the configuration, not references: nothing here depends on the compute
        # stack's exports but the subnets, the security group and the roles.
        log_prefix, family, cluster = (
            log_group_name(prefix),
            task_family(prefix),
            cluster_name(prefix),
        )
        self.environment = environment_for(
            EcsFleetSettings,
            cluster=cluster,
            task_definition=family,
            subnets=cdk.Fn.join(",", reward_fleet.subnet_ids),
            security_group=reward_fleet.security_group.security_group_id,
            log_group_prefix=log_prefix,
            token_parameter_prefix=f"/{prefix}/runs",
        )
        self._services = stack.format_arn(
            service="ecs",
            resource="service",
            resource_name=f"{cluster}/{run_prefix(prefix)}*",
        )
        self._task_definitions = stack.format_arn(
            service="ecs",
            resource="task-definition",
            resource_name=f"{run_prefix(prefix)}*",
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
        self._log_prefix = log_prefix
        # The worker image is a CDK asset, in the bootstrap's container assets repository.
        qualifier = cdk.DefaultStackSynthesizer.DEFAULT_QUALIFIER
        self._image_repository = stack.format_arn(
            service="ecr",
            resource="repository",
            resource_name=f"cdk-{qualifier}-container-assets-{stack.account}-{stack.region}",
        )
        self._scalable_targets = stack.format_arn(
            service="application-autoscaling", resource="scalable-target", resource_name="*"
        )
        # Target tracking makes (and removes) its alarms with the caller's rights (ECS Developer
        # Guide, "IAM permissions required for Amazon ECS service auto scaling"); they are named
        # `TargetTracking-<scalable target's resource id>-…`.
        self._scaling_alarms = alarm_arn(
            stack, f"TargetTracking-service/{cluster}/{run_prefix(prefix)}*"
        )
        self._autoscaling_role = stack.format_arn(
            service="iam",
            region="",
            resource="role",
            resource_name="aws-service-role/ecs.application-autoscaling.amazonaws.com/*",
        )
        # Per run: services under the deployment prefix, task definition families after the base
        # family, token parameters under the deployment's /runs path, worker log groups under
        # the fleet's prefix. Named by AWS: scalable targets, target tracking's alarms (after a
        # run's service) and ECS's Application Auto Scaling service-linked role.
        self._allow = Allow({
            self._services: Wildcard.NAMED_AT_RUN_TIME,
            f"{self._task_definitions}:*": Wildcard.NAMED_AT_RUN_TIME,
            self._parameters: Wildcard.NAMED_AT_RUN_TIME,
            self._run_log_groups: Wildcard.NAMED_AT_RUN_TIME,
            self._scalable_targets: Wildcard.ASSIGNED_BY_AWS,
            self._scaling_alarms: Wildcard.ASSIGNED_BY_AWS,
            self._autoscaling_role: Wildcard.ASSIGNED_BY_AWS,
        })  # fmt: skip
        self.task_role = iam.Role.from_role_arn(
            self, "TaskRole", reward_fleet.task_role.role_arn, mutable=True
        )
        self._grant_execution_role()

    def _grant_execution_role(self) -> None:
        # ECS starts each task with the execution role: the run's token and log group.
        execution_role = iam.Role.from_role_arn(
            self,
            "ExecutionRole",
            self._fleet.task_definition.obtain_execution_role().role_arn,
            mutable=True,
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
        reasons = self._allow.wildcards
        for resource, reason in (
            (self._parameters, reasons[self._parameters]),
            (f"{self._run_log_groups}:*", reasons[self._run_log_groups]),
        ):
            acknowledge_resource(startup, resource, reason)

    provides = frozenset(
        {
            Need.FLEET_START,
            Need.FLEET_WATCH,
            Need.FLEET_STOP,
            Need.WORKER_LOGS_READ,
            Need.WORKER_IMAGE_CHECK,
        }
    )

    def grant(self, need: Need, role: iam.IRole) -> None:
        services, definitions = self._services, f"{self._task_definitions}:*"
        fleet, allow = self._fleet, self._allow
        match need:
            case Need.FLEET_START:
                allow(role, ["ecs:DescribeServices", "ecs:CreateService"], services)
                allow(role, ["ecs:RegisterTaskDefinition"], definitions)
                # Tags on creation need ecs:TagResource (ECS Developer Guide).
                allow(role, ["ecs:TagResource"], services, definitions)
                # The base task definition: DescribeTaskDefinition has no resource type.
                allow(role, ["ecs:DescribeTaskDefinition"], "*")
                allow(
                    role,
                    ["iam:PassRole"],
                    fleet.task_role.role_arn,
                    fleet.task_definition.obtain_execution_role().role_arn,
                    conditions={"StringEquals": {"iam:PassedToService": "ecs-tasks.amazonaws.com"}},
                )
                allow(role, ["ssm:PutParameter", "ssm:GetParameter"], self._parameters)
                # The token is a SecureString under the data key (PutParameter: kms:Encrypt).
                allow(role, ["kms:Encrypt"], self._data_key.key_arn)
                allow(
                    role,
                    ["logs:CreateLogGroup", "logs:PutRetentionPolicy", "logs:TagResource"],
                    self._run_log_groups,
                )
                allow(
                    role,
                    [
                        "application-autoscaling:RegisterScalableTarget",
                        "application-autoscaling:PutScalingPolicy",
                    ],
                    self._scalable_targets,
                )
                # Registering checks the caller may change the service (Application Auto
                # Scaling User Guide, "Permissions validation").
                allow(role, ["ecs:UpdateService"], services)
                allow(
                    role,
                    ["cloudwatch:PutMetricAlarm", "cloudwatch:DescribeAlarms"],
                    self._scaling_alarms,
                )
                # The first scalable target of an account makes the service-linked role.
                allow(
                    role,
                    ["iam:CreateServiceLinkedRole"],
                    self._autoscaling_role,
                    conditions={
                        "StringLike": {
                            "iam:AWSServiceName": "ecs.application-autoscaling.amazonaws.com"
                        }
                    },
                )
            case Need.FLEET_WATCH:
                allow(role, ["ecs:DescribeServices"], services)
            case Need.FLEET_STOP:
                allow(
                    role,
                    ["ecs:DescribeServices", "ecs:UpdateService", "ecs:DeleteService"],
                    services,
                )
                # Listing and deregistering task definitions have no resource type.
                allow(role, ["ecs:ListTaskDefinitions", "ecs:DeregisterTaskDefinition"], "*")
                allow(role, ["application-autoscaling:DescribeScalableTargets"], "*")
                allow(
                    role,
                    ["application-autoscaling:DeregisterScalableTarget"],
                    self._scalable_targets,
                )
                allow(
                    role,
                    ["cloudwatch:DeleteAlarms", "cloudwatch:DescribeAlarms"],
                    self._scaling_alarms,
                )
                allow(role, ["ssm:DeleteParameter"], self._parameters)
            case Need.WORKER_LOGS_READ:
                grant_log_reading(role, log_group_arn(Stack.of(self), f"{self._log_prefix}/*"))
            case Need.WORKER_IMAGE_CHECK:
                allow(role, ["ecs:DescribeTaskDefinition"], "*")
                allow(role, ["ecr:DescribeImages"], self._image_repository)
