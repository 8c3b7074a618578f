"""The ECS Fargate reward fleet against moto: what it registers and creates for a run, that the
run token never sits in plain environment, backlog scaling, idempotence, and a full stop."""

from __future__ import annotations

from dataclasses import replace

import boto3
import pytest

from domain.backends import RunContext
from lambdas.pipeline.ecs_fleet import EcsFleetSettings, EcsRewardFleet, FleetFailed
from tests.service_fakes import ServiceFake
from training_configs.schema import load_training_config

RUN = RunContext(
    run_id="wordle-abc123",
    queues={
        "rollout_requests": "https://sqs/q-rollout-requests.fifo",
        "dlq": "https://sqs/q-dlq.fifo",
    },
    router_url="https://router.lambda-url.us-east-1.on.aws/",
    run_token="secret-token",
    bucket="data",
    dataset_key="training-data/w.jsonl",
    dataset_version=None,
    output_prefix="runs/wordle-abc123/",
    config=load_training_config("rft_multiturn_lora").model_copy(
        update={"rollout_concurrency": 16, "rollout_timeout_seconds": 600, "max_turns": 6}
    ),
)


@pytest.fixture
def fleet(aws: None) -> EcsRewardFleet:
    return EcsRewardFleet(
        deploy_fleet_base(),
        ecs=Recorded(boto3.client("ecs")),
        autoscaling=boto3.client("application-autoscaling"),
        logs=boto3.client("logs"),
        ssm=boto3.client("ssm"),
    )


def deploy_fleet_base() -> EcsFleetSettings:
    """What the compute stack deploys for the fleet (network, cluster, base task definition), in
    moto; the settings the pipeline functions would get."""
    ec2, ecs, iam = boto3.client("ec2"), boto3.client("ecs"), boto3.client("iam")
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnets = [
        ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.0.{i}.0/24")["Subnet"]["SubnetId"]
        for i in (1, 2)
    ]
    group = ec2.create_security_group(GroupName="workers", Description="w", VpcId=vpc)["GroupId"]
    ecs.create_cluster(clusterName="nova-mtrl-reward-workers")
    role = iam.create_role(RoleName="task", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
    ecs.register_task_definition(
        family="nova-mtrl-reward-worker", taskRoleArn=role, executionRoleArn=role,
        networkMode="awsvpc", requiresCompatibilities=["FARGATE"], cpu="1024", memory="2048",
        containerDefinitions=[{
            "name": "reward-worker", "image": "123456789012.dkr.ecr.us-east-1.amazonaws.com/w:1",
            "essential": True, "readonlyRootFilesystem": True,
            "logConfiguration": {"logDriver": "awslogs", "options": {
                "awslogs-group": "/nova-mtrl/reward-workers", "awslogs-region": "us-east-1",
                "awslogs-stream-prefix": "worker"}},
        }],
    )  # fmt: skip
    return EcsFleetSettings(
        NAME_PREFIX="nova-mtrl",
        WORKER_CLUSTER="nova-mtrl-reward-workers",
        WORKER_TASK_DEFINITION="nova-mtrl-reward-worker",
        WORKER_SUBNETS=",".join(subnets),
        WORKER_SECURITY_GROUP=group,
        WORKER_LOG_GROUP_PREFIX="/nova-mtrl/reward-workers",
        RUN_TOKEN_PARAMETER_PREFIX="/nova-mtrl/runs",
    )


class Recorded:
    """A client that records the requests it passes on."""

    def __init__(self, client: object) -> None:
        self.client, self.calls = client, []

    def __getattr__(self, name: str) -> object:
        attribute = getattr(self.client, name)
        if not callable(attribute) or name in ("get_paginator", "exceptions", "meta"):
            return attribute

        def call(**kwargs: object) -> object:
            self.calls.append((name, kwargs))
            return attribute(**kwargs)

        return call


def _service(fleet: EcsRewardFleet) -> dict:
    (service,) = boto3.client("ecs").describe_services(
        cluster="nova-mtrl-reward-workers", services=[fleet.service_name(RUN)]
    )["services"]
    return service


def test_start_creates_a_private_service_with_the_runs_settings(fleet: EcsRewardFleet) -> None:
    assert len(fleet.start(RUN, workers=3)) == 3
    service = _service(fleet)
    assert (service["status"], service["desiredCount"], service["launchType"]) == (
        "ACTIVE",
        3,
        "FARGATE",
    )
    network = service["networkConfiguration"]["awsvpcConfiguration"]
    assert network["assignPublicIp"] == "DISABLED" and network["subnets"] == fleet.settings.subnets
    assert network["securityGroups"] == [fleet.settings.security_group]
    # moto does not keep the deployment configuration: the request says it.
    (request,) = [kwargs for name, kwargs in fleet.ecs.calls if name == "create_service"]
    assert request["deploymentConfiguration"]["deploymentCircuitBreaker"]["enable"] is True
    definition = boto3.client("ecs").describe_task_definition(
        taskDefinition=service["taskDefinition"]
    )["taskDefinition"]
    assert definition["family"] == "nova-mtrl-run-wordle-abc123-workers"
    (container,) = definition["containerDefinitions"]
    environment = {item["name"]: item["value"] for item in container["environment"]}
    assert environment["MTRL_ROLLOUT_REQUEST_QUEUE_URL"] == RUN.queues["rollout_requests"]
    assert (
        environment["MTRL_ROUTER_URL"] == RUN.router_url
        and environment["MTRL_RUN_ID"] == RUN.run_id
    )
    assert environment["MTRL_CONCURRENCY"] == "16" and environment["MTRL_MAX_TURNS"] == "6"
    # The token is a secret from SSM, never in the task definition's text.
    assert "secret-token" not in str(definition)
    (secret,) = container["secrets"]
    assert secret["name"] == "MTRL_RUN_TOKEN" and secret["valueFrom"].endswith(
        ":parameter/nova-mtrl/runs/wordle-abc123/token"
    )
    stored = boto3.client("ssm").get_parameter(
        Name="/nova-mtrl/runs/wordle-abc123/token", WithDecryption=True
    )
    assert (
        stored["Parameter"]["Type"] == "SecureString"
        and stored["Parameter"]["Value"] == "secret-token"
    )
    assert (
        container["logConfiguration"]["options"]["awslogs-group"]
        == "/nova-mtrl/reward-workers/wordle-abc123"
    )
    assert container["readonlyRootFilesystem"] is True and container["image"].endswith("/w:1")
    (group,) = boto3.client("logs").describe_log_groups(
        logGroupNamePrefix="/nova-mtrl/reward-workers/"
    )["logGroups"]
    assert group["retentionInDays"] == 90
    # No scaling when the config does not allow more workers.
    assert not boto3.client("application-autoscaling").describe_scalable_targets(
        ServiceNamespace="ecs"
    )["ScalableTargets"]


def test_start_is_idempotent(fleet: EcsRewardFleet) -> None:
    fleet.start(RUN, workers=2)
    fleet.start(RUN, workers=2)
    services = boto3.client("ecs").list_services(cluster="nova-mtrl-reward-workers")["serviceArns"]
    assert len(services) == 1
    definitions = boto3.client("ecs").list_task_definitions(familyPrefix=fleet.family(RUN))[
        "taskDefinitionArns"
    ]
    assert len(definitions) == 1


def test_the_fleet_scales_on_backlog_per_task_when_allowed(fleet: EcsRewardFleet) -> None:
    run = replace(RUN, config=RUN.training.model_copy(update={"reward_workers_max": 10}))
    fleet.start(run, workers=2)
    scaling = boto3.client("application-autoscaling")
    (target,) = scaling.describe_scalable_targets(ServiceNamespace="ecs")["ScalableTargets"]
    assert (target["MinCapacity"], target["MaxCapacity"]) == (2, 10)
    assert target["ResourceId"] == f"service/nova-mtrl-reward-workers/{fleet.service_name(run)}"
    (policy,) = scaling.describe_scaling_policies(ServiceNamespace="ecs")["ScalingPolicies"]
    tracking = policy["TargetTrackingScalingPolicyConfiguration"]
    assert tracking["TargetValue"] == 16.0
    metrics = {m["Id"]: m for m in tracking["CustomizedMetricSpecification"]["Metrics"]}
    waiting = metrics["waiting"]["MetricStat"]["Metric"]
    assert waiting["MetricName"] == "ApproximateNumberOfMessagesVisible"
    assert waiting["Dimensions"] == [
        {"Name": "QueueName", "Value": "nova-mtrl-run-wordle-abc123-rollout-requests.fifo"}
    ]
    assert metrics["backlog_per_task"]["ReturnData"] is True
    fleet.stop(run)
    assert not scaling.describe_scalable_targets(ServiceNamespace="ecs")["ScalableTargets"]


def test_stop_removes_everything_and_can_repeat(fleet: EcsRewardFleet) -> None:
    fleet.start(RUN, workers=2)
    fleet.stop(RUN)
    assert fleet.healthy(RUN) == 0 and fleet.stop(RUN) == 0
    ecs = boto3.client("ecs")
    assert not ecs.list_task_definitions(familyPrefix=fleet.family(RUN), status="ACTIVE")[
        "taskDefinitionArns"
    ]
    assert not boto3.client("ssm").describe_parameters()["Parameters"]
    assert not [
        s
        for s in ecs.describe_services(
            cluster="nova-mtrl-reward-workers", services=[fleet.service_name(RUN)]
        )["services"]
        if s["status"] == "ACTIVE"
    ]


class TrippedBreaker(ServiceFake):
    """ECS reporting a service whose deployment the circuit breaker stopped."""

    service = "ecs"

    def describe_services(self, **_: object) -> dict:
        return {"services": [{"status": "ACTIVE", "runningCount": 0, "deployments": [
            {"rolloutState": "FAILED", "rolloutStateReason": "ECS deployment circuit breaker: tasks failed to start."}]}]}  # fmt: skip


def test_a_tripped_circuit_breaker_is_a_failure_with_its_reason(fleet: EcsRewardFleet) -> None:
    broken = EcsRewardFleet(
        fleet.settings,
        ecs=TrippedBreaker().client(),
        autoscaling=fleet.autoscaling,
        logs=fleet.logs,
        ssm=fleet.ssm,
    )
    with pytest.raises(
        FleetFailed, match="wordle-abc123 failed to start: ECS deployment circuit breaker"
    ):
        broken.healthy(RUN)
