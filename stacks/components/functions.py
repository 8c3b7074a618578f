"""The pipeline's Lambda functions: Python 3.12, own role and log group, X-Ray, acknowledged L1;
those that call the EKS cluster's API run in the VPC (ClusterNetwork)."""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import Duration, RemovalPolicy, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

from stacks.components.lambda_code import ARCHITECTURE, RUNTIME
from stacks.components.nag import acknowledge, acknowledge_resource
from stacks.components.network import interface_scope


@dataclass(frozen=True)
class ClusterNetwork:
    """Where a function that calls the Kubernetes API runs: the VPC's private subnets, in the EKS
    cluster's security group, whose members reach each other — the API server's private
    endpoint among them. The public endpoint may then admit operators' addresses only
    (`eks_public_access_cidrs`)."""

    vpc: ec2.IVpc
    subnets: ec2.SubnetSelection
    security_group: ec2.ISecurityGroup


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
    network: ClusterNetwork | None = None,
    runtime: lambda_.Runtime = RUNTIME,
) -> lambda_.Function:
    """A function with a role of its own (no managed policies) that may only write its own logs
    (and, in `network`, manage its network interfaces there)."""
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
        runtime=runtime,
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
        vpc=network.vpc if network else None,
        vpc_subnets=network.subnets if network else None,
        security_groups=[network.security_group] if network else None,
    )
    if network:
        _allow_network_interfaces(role, network)
    acknowledge(
        function,
        "AwsSolutions-L1",
        "The pipeline Lambdas target Python 3.12 on purpose: their wheels are built for "
        "cp312 and the runtime is supported; upgrades are a deliberate change.",
    )
    acknowledge(
        role,
        "AwsSolutions-IAM5[Resource::*]",
        "X-Ray PutTraceSegments and PutTelemetryRecords have no resource-level permissions"
        + (", and ec2:DescribeNetworkInterfaces works on all resources only (Lambda's VPC "
           "attachment)." if network else "."),
    )  # fmt: skip
    return function


def _allow_network_interfaces(role: iam.Role, network: ClusterNetwork) -> None:
    """What Lambda does with the function's role to attach it to the VPC (Lambda Developer Guide,
    "Giving Lambda functions access to resources in an Amazon VPC"): create interfaces in these
    subnets and this security group, describe them (all resources only), delete them and manage
    their addresses."""
    create, interfaces = interface_scope(
        Stack.of(role),
        subnet_ids=network.vpc.select_subnets(subnet_type=network.subnets.subnet_type).subnet_ids,
        security_group_id=network.security_group.security_group_id,
    )
    role.add_to_policy(
        iam.PolicyStatement(actions=["ec2:CreateNetworkInterface"], resources=create)
    )
    role.add_to_policy(
        iam.PolicyStatement(
            actions=[
                "ec2:DeleteNetworkInterface",
                "ec2:AssignPrivateIpAddresses",
                "ec2:UnassignPrivateIpAddresses",
            ],
            resources=[interfaces],
        )
    )
    role.add_to_policy(
        iam.PolicyStatement(actions=["ec2:DescribeNetworkInterfaces"], resources=["*"])
    )
    acknowledge_resource(
        role,
        "AwsSolutions-IAM5",
        interfaces,
        "Lambda creates the function's network interfaces in the VPC; their ids are made then. "
        "Only the subnets and security group named here can hold them.",
    )
