"""The pipeline's Lambda functions: Python 3.12, own role and log group (encrypted with the
deployment's key), X-Ray, acknowledged L1; those that call the EKS cluster's API run in the VPC
(ClusterNetwork). What outside scanners ask of every function and does not apply is justified
on it (stacks/components/scan.py)."""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import Duration, RemovalPolicy, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from stacks.components.lambda_code import ARCHITECTURE, RUNTIME
from stacks.components.nag import (
    Wildcard,
    acknowledge,
    acknowledge_no_resource_type,
    acknowledge_resource,
)
from stacks.components.network import interface_scope
from stacks.components.scan import justify

# Why the scanners' function-wide checks do not apply (checkov's ids).
NO_RESERVED_CONCURRENCY = (
    "Reserved concurrency is taken from the account's pool and fails the deploy where that pool "
    "is small (new accounts); each function is bounded by what invokes it: a state, a run's "
    "queue, a run's workers, a schedule (router_reserved_concurrency reserves it for the router)"
)
ENVIRONMENT_WITHOUT_SECRETS = (
    "Its environment holds resource names and settings only, never a secret (a run's token is "
    "an SSM SecureString read at run time); Lambda encrypts it at rest with an AWS owned key"
)
CUSTOM_RESOURCE = (
    "CloudFormation invokes it synchronously for its custom resource; a failure fails and rolls "
    "back the stack operation"
)
OUTSIDE_THE_VPC = (
    "It calls AWS APIs only, with its own IAM role, and reaches nothing inside the VPC; the "
    "functions that call the EKS API run in the VPC"
)


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
    log_key: kms.IKey,
    invocation: str | None,
    dead_letter_queue: sqs.IQueue | None = None,
    memory_size: int = 512,
    network: ClusterNetwork | None = None,
    runtime: lambda_.Runtime = RUNTIME,
    reserved_concurrency: int | None = None,
    function_name: str | None = None,
) -> lambda_.Function:
    """A function with a role of its own (no managed policies) that may only write its own logs
    (and, in `network`, manage its network interfaces there). `invocation`: who invokes it and
    sees its errors, the reason it needs no dead-letter queue — or None, and its
    `dead_letter_queue`. `reserved_concurrency`: its share of the account's concurrency, both
    guaranteed and its limit (None: the unreserved pool, justified for the scanners).
    `function_name`: a name others must see (None: CloudFormation's)."""
    if (invocation is None) == (dead_letter_queue is None):
        raise ValueError(f"{name}: give a dead-letter queue, or who invokes it and sees its errors")
    log_group = logs.LogGroup(
        scope,
        f"{name}Logs",
        retention=logs.RetentionDays.THREE_MONTHS,
        removal_policy=RemovalPolicy.DESTROY,
        encryption_key=log_key,
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
        function_name=function_name,
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
        dead_letter_queue=dead_letter_queue,
        reserved_concurrent_executions=reserved_concurrency,
        vpc=network.vpc if network else None,
        vpc_subnets=network.subnets if network else None,
        security_groups=[network.security_group] if network else None,
    )
    if network:
        _allow_network_interfaces(role, network)
    else:
        justify(function, "CKV_AWS_117", OUTSIDE_THE_VPC)
    if invocation:
        justify(function, "CKV_AWS_116", f"{invocation}: a dead-letter queue would hold nothing")
    if reserved_concurrency is None:
        justify(function, "CKV_AWS_115", NO_RESERVED_CONCURRENCY)
    justify(function, "CKV_AWS_173", ENVIRONMENT_WITHOUT_SECRETS)
    acknowledge(
        function,
        "AwsSolutions-L1",
        "The pipeline Lambdas target Python 3.12 on purpose: their wheels are built for "
        "cp312 and the runtime is supported; upgrades are a deliberate change.",
    )
    acknowledge_no_resource_type(role)  # X-Ray's, and ec2:DescribeNetworkInterfaces in the VPC
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
    # Lambda creates the interfaces, EC2 gives them their ids; only the subnets and security
    # group named above can hold them.
    acknowledge_resource(role, interfaces, Wildcard.ASSIGNED_BY_AWS)
