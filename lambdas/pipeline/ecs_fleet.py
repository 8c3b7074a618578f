"""The reward fleet on ECS Fargate: one service per run.

For a run it registers a task definition of its own (a copy of the deployment's worker task
definition with the run's queues, router and limits in its environment, and the run token as a
secret from an SSM SecureString — never in plain environment), a log group, and a service in
the private subnets without public IPs, with the deployment circuit breaker. When the config
allows more workers than it starts with, Application Auto Scaling tracks the rollout-request
backlog per running task. Stopping scales to zero and deletes all of it; every step can repeat.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping
from typing import Any

from pydantic import Field, field_validator

from domain.backends import RewardFleet, RunContext, worker_environment
from domain.naming import WORKER_CONTAINER, worker_service_name
from domain.run_queues import QueueKind, queue_name
from lambdas.clients import Clients
from lambdas.environment import EnvironmentSettings

LOG_RETENTION_DAYS = 90
SCALABLE_DIMENSION = "ecs:service:DesiredCount"
RUN_TAG = "nova-mtrl:run"


class FleetFailed(RuntimeError):
    """The run's workers cannot start (the deployment circuit breaker stopped them)."""


class EcsFleetSettings(EnvironmentSettings):
    """From the pipeline functions' environment (set by the pipeline stack)."""

    prefix: str = Field(alias="NAME_PREFIX")
    cluster: str = Field(alias="WORKER_CLUSTER")
    task_definition: str = Field(alias="WORKER_TASK_DEFINITION", description="base family")
    subnets: list[str] = Field(alias="WORKER_SUBNETS")
    security_group: str = Field(alias="WORKER_SECURITY_GROUP")
    log_group_prefix: str = Field(alias="WORKER_LOG_GROUP_PREFIX")
    token_parameter_prefix: str = Field(alias="RUN_TOKEN_PARAMETER_PREFIX")
    data_key_arn: str | None = Field(default=None, alias="DATA_KEY_ARN")

    @field_validator("subnets", mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        return [s for s in value.split(",") if s] if isinstance(value, str) else value


def _name(*parts: str) -> str:
    """An ECS-safe name (letters, digits, hyphens, underscores; at most 255)."""
    return re.sub(r"[^A-Za-z0-9_-]", "-", "-".join(parts))[:255]


class EcsRewardFleet(RewardFleet):
    def __init__(
        self,
        settings: EcsFleetSettings,
        *,
        ecs: Any,
        autoscaling: Any,
        logs: Any,
        ssm: Any,
    ) -> None:
        self.settings = settings
        self.ecs, self.autoscaling, self.logs, self.ssm = ecs, autoscaling, logs, ssm

    @classmethod
    def from_environment(cls, environment: Mapping[str, str], clients: Clients) -> EcsRewardFleet:
        return cls(
            EcsFleetSettings.from_environment(environment),
            ecs=clients("ecs"),
            autoscaling=clients("application-autoscaling"),
            logs=clients("logs"),
            ssm=clients("ssm"),
        )

    # --- names of a run's resources ---

    def service_name(self, run: RunContext) -> str:
        return worker_service_name(self.settings.prefix, run.run_id)

    def family(self, run: RunContext) -> str:
        return worker_service_name(self.settings.prefix, run.run_id)

    def log_group(self, run: RunContext) -> str:
        return f"{self.settings.log_group_prefix}/{run.run_id}"

    def token_parameter(self, run: RunContext) -> str:
        return f"{self.settings.token_parameter_prefix}/{run.run_id}/token"

    # --- RewardFleet ---

    def start(self, run: RunContext, *, workers: int) -> list[str]:
        service = self._service(run)
        if service is None:
            token_arn = self._put_token(run)
            self._ensure_log_group(run)
            task_definition = self._register_task_definition(run, token_arn)
            self.ecs.create_service(
                cluster=self.settings.cluster,
                serviceName=self.service_name(run),
                taskDefinition=task_definition,
                desiredCount=workers,
                launchType="FARGATE",
                networkConfiguration={
                    "awsvpcConfiguration": {
                        "subnets": self.settings.subnets,
                        "securityGroups": [self.settings.security_group],
                        "assignPublicIp": "DISABLED",
                    }
                },
                deploymentConfiguration={
                    "deploymentCircuitBreaker": {"enable": True, "rollback": False},
                    "minimumHealthyPercent": 0,
                    "maximumPercent": 200,
                },
                propagateTags="SERVICE",
                enableECSManagedTags=True,
                tags=[{"key": RUN_TAG, "value": run.run_id}],
            )
        maximum = run.training.reward_workers_max or workers
        if maximum > workers:
            self._scale_on_backlog(run, minimum=workers, maximum=maximum)
        return [f"{self.service_name(run)}/{index}" for index in range(workers)]

    def healthy(self, run: RunContext) -> int:
        service = self._service(run)
        if service is None:
            return 0
        for deployment in service.get("deployments", []):
            if deployment.get("rolloutState") == "FAILED":
                raise FleetFailed(
                    f"reward workers of run {run.run_id} failed to start: "
                    f"{deployment.get('rolloutStateReason', 'circuit breaker tripped')}"
                )
        return int(service.get("runningCount", 0))

    def stop(self, run: RunContext) -> int:
        service = self._service(run)
        running = int(service.get("runningCount", 0)) if service else 0
        resource = self._scaling_resource(run)
        targets = self.autoscaling.describe_scalable_targets(
            ServiceNamespace="ecs", ResourceIds=[resource]
        )["ScalableTargets"]
        if targets:
            self.autoscaling.deregister_scalable_target(
                ServiceNamespace="ecs", ResourceId=resource, ScalableDimension=SCALABLE_DIMENSION
            )
        if service is not None:
            name = self.service_name(run)
            self.ecs.update_service(cluster=self.settings.cluster, service=name, desiredCount=0)
            self.ecs.delete_service(cluster=self.settings.cluster, service=name, force=True)
        for arn in self._task_definitions(run):
            self.ecs.deregister_task_definition(taskDefinition=arn)
        with contextlib.suppress(self.ssm.exceptions.ParameterNotFound):
            self.ssm.delete_parameter(Name=self.token_parameter(run))
        return running

    # --- parts ---

    def _service(self, run: RunContext) -> dict[str, Any] | None:
        services = self.ecs.describe_services(
            cluster=self.settings.cluster, services=[self.service_name(run)]
        )["services"]
        active = [s for s in services if s.get("status") == "ACTIVE"]
        return active[0] if active else None

    def _put_token(self, run: RunContext) -> str:
        name = self.token_parameter(run)
        extra = {"KeyId": self.settings.data_key_arn} if self.settings.data_key_arn else {}
        self.ssm.put_parameter(
            Name=name,
            Value=run.run_token,
            Type="SecureString",
            Overwrite=True,
            Description=f"nova-mtrl run {run.run_id}: the token its reward workers present",
            **extra,
        )
        return self.ssm.get_parameter(Name=name)["Parameter"]["ARN"]

    def _ensure_log_group(self, run: RunContext) -> None:
        with contextlib.suppress(self.logs.exceptions.ResourceAlreadyExistsException):
            self.logs.create_log_group(logGroupName=self.log_group(run), tags={RUN_TAG: run.run_id})
        self.logs.put_retention_policy(
            logGroupName=self.log_group(run), retentionInDays=LOG_RETENTION_DAYS
        )

    def _register_task_definition(self, run: RunContext, token_arn: str) -> str:
        base = self.ecs.describe_task_definition(taskDefinition=self.settings.task_definition)[
            "taskDefinition"
        ]
        container = next(c for c in base["containerDefinitions"] if c["name"] == WORKER_CONTAINER)
        log_options = dict(container.get("logConfiguration", {}).get("options", {}))
        log_options |= {"awslogs-group": self.log_group(run), "awslogs-stream-prefix": "worker"}
        worker = {
            **container,
            "environment": [{"name": k, "value": v} for k, v in worker_environment(run).items()],
            "secrets": [{"name": "MTRL_RUN_TOKEN", "valueFrom": token_arn}],
            "logConfiguration": {"logDriver": "awslogs", "options": log_options},
        }
        kept = (
            "taskRoleArn",
            "executionRoleArn",
            "networkMode",
            "requiresCompatibilities",
            "cpu",
            "memory",
            "runtimePlatform",
        )
        registered = self.ecs.register_task_definition(
            family=self.family(run),
            containerDefinitions=[worker],
            tags=[{"key": RUN_TAG, "value": run.run_id}],
            **{key: base[key] for key in kept if key in base},
        )
        return registered["taskDefinition"]["taskDefinitionArn"]

    def _task_definitions(self, run: RunContext) -> list[str]:
        pages = self.ecs.get_paginator("list_task_definitions").paginate(
            familyPrefix=self.family(run), status="ACTIVE"
        )
        return [
            arn
            for page in pages
            for arn in page["taskDefinitionArns"]
            if arn.rsplit("/", 1)[-1].rsplit(":", 1)[0] == self.family(run)
        ]

    def _scaling_resource(self, run: RunContext) -> str:
        return f"service/{self.settings.cluster}/{self.service_name(run)}"

    def _scale_on_backlog(self, run: RunContext, *, minimum: int, maximum: int) -> None:
        """Target tracking on visible rollout requests per running task (a task plays
        `rollout_concurrency` episodes at once: more waiting than that per task, add tasks)."""
        resource = self._scaling_resource(run)
        self.autoscaling.register_scalable_target(
            ServiceNamespace="ecs",
            ResourceId=resource,
            ScalableDimension=SCALABLE_DIMENSION,
            MinCapacity=minimum,
            MaxCapacity=maximum,
        )
        queue = queue_name(self.settings.prefix, run.run_id, QueueKind.ROLLOUT_REQUESTS)
        self.autoscaling.put_scaling_policy(
            PolicyName=_name(self.service_name(run), "backlog"),
            ServiceNamespace="ecs",
            ResourceId=resource,
            ScalableDimension=SCALABLE_DIMENSION,
            PolicyType="TargetTrackingScaling",
            TargetTrackingScalingPolicyConfiguration={
                "TargetValue": float(run.training.rollout_concurrency),
                "ScaleInCooldown": 120,
                "ScaleOutCooldown": 60,
                "CustomizedMetricSpecification": {
                    "Metrics": [
                        {
                            "Id": "waiting",
                            "MetricStat": {
                                "Metric": {
                                    "Namespace": "AWS/SQS",
                                    "MetricName": "ApproximateNumberOfMessagesVisible",
                                    "Dimensions": [{"Name": "QueueName", "Value": queue}],
                                },
                                "Stat": "Sum",
                            },
                            "ReturnData": False,
                        },
                        {
                            "Id": "tasks",
                            "MetricStat": {
                                "Metric": {
                                    "Namespace": "ECS/ContainerInsights",
                                    "MetricName": "RunningTaskCount",
                                    "Dimensions": [
                                        {"Name": "ClusterName", "Value": self.settings.cluster},
                                        {"Name": "ServiceName", "Value": self.service_name(run)},
                                    ],
                                },
                                "Stat": "Average",
                            },
                            "ReturnData": False,
                        },
                        {
                            "Id": "backlog_per_task",
                            "Expression": "waiting / IF(tasks > 0, tasks, 1)",
                            "Label": "rollout requests waiting per running worker",
                            "ReturnData": True,
                        },
                    ]
                },
            },
        )
