"""The pipeline's Lambda functions: Python 3.12, own role and log group, X-Ray, acknowledged L1."""

from __future__ import annotations

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

from stacks.components.lambda_code import ARCHITECTURE, RUNTIME
from stacks.components.nag import acknowledge


def pipeline_function(
    scope: Construct,
    name: str,
    *,
    handler: str,
    description: str,
    code: lambda_.Code,
    timeout: Duration,
    environment: dict[str, str],
    memory_size: int = 512,
) -> lambda_.Function:
    """A function with a role of its own (no managed policies) that may only write its own logs."""
    log_group = logs.LogGroup(
        scope,
        f"{name}Logs",
        retention=logs.RetentionDays.THREE_MONTHS,
        removal_policy=RemovalPolicy.DESTROY,
    )
    role = iam.Role(
        scope,
        f"{name}Role",
        assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
        description=description,
    )
    log_group.grant_write(role)
    function = lambda_.Function(
        scope,
        name,
        runtime=RUNTIME,
        architecture=ARCHITECTURE,
        handler=handler,
        code=code,
        description=description,
        timeout=timeout,
        memory_size=memory_size,
        role=role,
        log_group=log_group,
        tracing=lambda_.Tracing.ACTIVE,
        environment=environment,
    )
    acknowledge(
        function,
        "AwsSolutions-L1",
        "The pipeline Lambdas target Python 3.12 on purpose: their wheels are built for "
        "cp312 and the runtime is supported; upgrades are a deliberate change.",
    )
    acknowledge(
        role,
        "AwsSolutions-IAM5[Resource::*]",
        "X-Ray PutTraceSegments and PutTelemetryRecords have no resource-level permissions.",
    )
    return function
