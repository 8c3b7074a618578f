"""Phase 1: the network."""

from __future__ import annotations

from aws_cdk import aws_kms as kms
from constructs import Construct

from stacks.base import PlatformStack
from stacks.components.network import Network
from stacks.config import PlatformConfig


class NetworkStack(PlatformStack):
    def __init__(self, scope: Construct, *, config: PlatformConfig, log_key: kms.IKey) -> None:
        """`log_key`: the storage stack's, for the flow logs."""
        super().__init__(scope, "network", config=config, description="VPC, subnets, endpoints")
        self.network = network_of(self, "Network", config, log_key=log_key)


def network_of(
    scope: Construct, construct_id: str, config: PlatformConfig, *, log_key: kms.IKey
) -> Network:
    """The deployment's network as its configuration describes it (a new VPC, or the existing
    one it names)."""
    return Network(
        scope, construct_id, name_prefix=config.name_prefix, existing=config.existing_vpc,
        cidr=config.vpc_cidr, zones=config.zones, az_count=config.az_count, log_key=log_key,
    )  # fmt: skip
