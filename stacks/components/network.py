"""The VPC every plane runs in: private subnets for workers and GPU nodes, private endpoints."""

from __future__ import annotations

from aws_cdk import RemovalPolicy, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from constructs import Construct

from stacks.config import ExistingVpc


def interface_scope(
    stack: Stack, *, subnet_ids: list[str], security_group_id: str
) -> tuple[list[str], str]:
    """What `ec2:CreateNetworkInterface` may be limited to for interfaces in these subnets and
    this security group (the subnets, the group, and interfaces), and the ARN of any network
    interface: their ids are made at run time."""
    interfaces = stack.format_arn(service="ec2", resource="network-interface", resource_name="*")
    subnets = [
        stack.format_arn(service="ec2", resource="subnet", resource_name=subnet_id)
        for subnet_id in subnet_ids
    ]
    group = stack.format_arn(
        service="ec2", resource="security-group", resource_name=security_group_id
    )
    return [*subnets, group, interfaces], interfaces


# The AWS APIs the planes call from private subnets: image pulls (ECR), cluster and pod auth
# (EKS, EKS Auth, STS), logs, the rollout queues (SQS), the pipeline (Lambda) and HyperPod
# node agents (SageMaker API).
INTERFACE_ENDPOINTS: dict[str, ec2.InterfaceVpcEndpointAwsService] = {
    "Ecr": ec2.InterfaceVpcEndpointAwsService.ECR,
    "EcrDocker": ec2.InterfaceVpcEndpointAwsService.ECR_DOCKER,
    "Eks": ec2.InterfaceVpcEndpointAwsService.EKS,
    "EksAuth": ec2.InterfaceVpcEndpointAwsService.EKS_AUTH,
    "Sts": ec2.InterfaceVpcEndpointAwsService.STS,
    "Logs": ec2.InterfaceVpcEndpointAwsService.CLOUDWATCH_LOGS,
    "Sqs": ec2.InterfaceVpcEndpointAwsService.SQS,
    "Lambda": ec2.InterfaceVpcEndpointAwsService.LAMBDA_,
    "SageMakerApi": ec2.InterfaceVpcEndpointAwsService.SAGEMAKER_API,
}


class Network(Construct):
    """A new VPC (public + private subnets, NAT, flow logs, endpoints) or an imported one.

    Attributes: `vpc`, `private_subnets` (where workers and GPU nodes go).
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        name_prefix: str,
        existing: ExistingVpc | None,
        cidr: str,
        zones: list[str] | None,
        az_count: int,
        log_key: kms.IKey,
    ) -> None:
        """`existing`: a VPC to use instead of a new one; else a new VPC of `cidr` over `zones`
        (None: `az_count` zones CloudFormation picks); `log_key` encrypts its flow logs."""
        super().__init__(scope, construct_id)
        self.private_subnets = ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS)
        if existing:
            # Endpoints and flow logs of an existing VPC are its owner's: adding interface
            # endpoints with private DNS next to existing ones fails the deployment.
            self.vpc: ec2.IVpc = ec2.Vpc.from_vpc_attributes(
                self,
                "Vpc",
                vpc_id=existing.vpc_id,
                availability_zones=list(existing.availability_zones),
                private_subnet_ids=list(existing.private_subnet_ids),
                public_subnet_ids=list(existing.public_subnet_ids) or None,
            )
            return
        vpc = ec2.Vpc(
            self,
            "Vpc",
            vpc_name=f"{name_prefix}-vpc",
            ip_addresses=ec2.IpAddresses.cidr(cidr),
            # Explicit zones, or az_count zones that the stack picks without a lookup.
            availability_zones=zones,
            max_azs=None if zones else az_count,
            nat_gateways=az_count,
            subnet_configuration=[
                ec2.SubnetConfiguration(
                    name="public", subnet_type=ec2.SubnetType.PUBLIC, cidr_mask=24
                ),
                # No mask: the private subnets share the rest of the CIDR, since GPU nodes
                # and their pods each take many addresses (VPC CNI, EFA).
                ec2.SubnetConfiguration(
                    name="private", subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS
                ),
            ],
            gateway_endpoints={
                "S3": ec2.GatewayVpcEndpointOptions(service=ec2.GatewayVpcEndpointAwsService.S3),
                "DynamoDb": ec2.GatewayVpcEndpointOptions(
                    service=ec2.GatewayVpcEndpointAwsService.DYNAMODB
                ),
            },
        )
        flow_log_group = logs.LogGroup(
            self,
            "FlowLogs",
            retention=logs.RetentionDays.ONE_YEAR,
            removal_policy=RemovalPolicy.DESTROY,
            encryption_key=log_key,
        )
        vpc.add_flow_log(
            "FlowLog",
            destination=ec2.FlowLogDestination.to_cloud_watch_logs(flow_log_group),
            traffic_type=ec2.FlowLogTrafficType.ALL,
        )
        for name, service in INTERFACE_ENDPOINTS.items():
            endpoint = vpc.add_interface_endpoint(
                f"{name}Endpoint",
                service=service,
                subnets=self.private_subnets,
                private_dns_enabled=True,
                open=False,
            )
            # HTTPS from inside the VPC only, written as the literal CIDR so it can be checked.
            endpoint.connections.allow_from(
                ec2.Peer.ipv4(cidr), ec2.Port.tcp(443), "HTTPS from the VPC"
            )
        self.vpc = vpc
